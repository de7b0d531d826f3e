"""What the batch tests share: tiny models of each family and a batch cache of each layout."""
import functools

from models.registry import build_random_model

WIDTH = 48  # positions per batch row


@functools.lru_cache(maxsize=None)
def tiny(fam: str, seed: int = 3):
    return build_random_model(fam, "tiny", seed=seed)


def batch_cache(ctx, layout: str, rows: int = 4, width: int = WIDTH):
    """A batch-slot cache (latent for MLA families), or a paged batch of 4-position blocks."""
    if layout == "paged":
        return ctx.new_paged_batch(ctx.new_pool(64, 4), rows, width // 4)
    return ctx.new_batch_cache(rows, width)
