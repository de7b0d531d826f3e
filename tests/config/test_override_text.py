"""``override_literal``: any text, quoted for Hydra's override grammar and OmegaConf's, composes back to itself."""
from __future__ import annotations

import random
import shlex

from fuelpipe.config.override_text import override_literal, parse_problems, shell_word

TRICKY = ["Hello, how are you?", "What's a cache?", 'say "hi"', "a\\", 'a\\"b', "x ${y} z", "x \\${y}", "\\\\${a}",
          "${", "}", "[1,2]", "=", "@x", "-", "tab\there", "line\nbreak", "end\\\n", "'", '"', "\\", "null", "123",
          "true", "", "ünïcode ✓", "{a: b}", "~x", "a'b\"c\\d${e}f"]


def test_any_text_composes_back_to_itself(compose_cfg):
    rng = random.Random(0)
    texts = TRICKY + ["".join(rng.choice("ab ,'\"\\${}[]:=@\n") for _ in range(rng.randint(1, 12))) for _ in range(60)]
    for text in texts:
        word = shell_word("prompt", text)
        assert shlex.split(word) == [f"prompt={override_literal(text)}"]
        assert compose_cfg([f"prompt={override_literal(text)}"]).prompt == text, (text, word)


def test_negative_control_quotes_alone_do_not_keep_the_text(compose_cfg):
    """The check above can fail: quoting without escaping loses an interpolation and a final backslash."""
    assert compose_cfg(['prompt="cost ${experiment.name}"']).prompt == "cost default"
    assert compose_cfg(['prompt="a\\\\"']).prompt != "a\\\\"


def test_parse_problems_name_each_refused_override_once():
    def parse(o):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        OverridesParser.create().parse_override(o)

    problems = parse_problems(["model=llama_tiny", "prompt=Hello,", "how", "are", "x=[1,"], parse)
    assert len(problems) == 2
    assert problems[0].startswith("'how', 'are' are not overrides (key=value); if they are the rest of 'prompt=Hello,'")
    assert "'prompt=\"Hello, how are\"'" in problems[0]
    assert problems[1].startswith("cannot parse the override 'x=[1,' (no viable alternative at input '[1,')")
