"""The fx passes a traced backend runs when the config names none: the one list the schema, the backend
YAMLs (which leave ``fx_passes`` out) and ``BackendSpec`` all take. Torch-free, so the config schema can
import it. Each pass is described in ``fuelpipe.plan.fx_passes``."""

DEFAULT_FX_PASSES = ("fuse_sibling_linears", "measured_linears", "slot_attention_kernel",
                     "eliminate_dead_code_keeping_writes")
