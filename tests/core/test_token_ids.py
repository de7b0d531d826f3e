"""Token ids and counts, checked once for every entry point (fuelpipe.token_ids)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fuelpipe.errors import InputError
from fuelpipe.token_ids import count_arg, token_id_list, token_id_tensor, token_int


def test_every_sequence_kind_becomes_plain_ints():
    want = [3, 1, 4]
    for given in (want, tuple(want), np.array(want), torch.tensor(want), range(3, 4)):
        got = token_id_list(given, "prompt")
        assert all(type(t) is int for t in got) and got == (list(given) if not isinstance(given, range) else [3])
    assert token_id_tensor([5, 6]).tolist() == [[5, 6]]  # [1, T]
    assert token_id_tensor(torch.tensor([[5, 6]])).shape == (1, 2)


@pytest.mark.parametrize("bad,match", [
    ("abc", "prompt must be a sequence of token ids, got str"),
    (7, "prompt must be a sequence of token ids, got int"),
    (torch.tensor([1.0, 2.0]), "prompt: token ids must be integers, got dtype torch.float32"),
    ([1, 2.5], "token ids must be integers, got float 2.5"),
    ([True], "token ids must be integers, got True"),
    ([2 ** 63], "does not fit int64"),
])
def test_bad_token_ids_get_a_typed_error_naming_the_argument(bad, match):
    with pytest.raises(InputError, match=match):
        token_id_list(bad, "prompt")


def test_counts_are_non_negative_integers():
    assert count_arg("max_new_tokens", np.int64(4)) == 4 and token_int(np.int32(9)) == 9
    for bad, match in ((-1, "max_new_tokens must be >= 0, got -1"), (2.0, "must be an integer, got float"),
                       (True, "must be an integer, got bool")):
        with pytest.raises(InputError, match=match):
            count_arg("max_new_tokens", bad)
