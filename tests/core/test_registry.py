"""Registries: built-ins come from fuelpipe's own entry points; clashes, broken plugins and bad entries are typed."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from fuelpipe.errors import ConfigError
from fuelpipe.family import FamilyEntry
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan.backends import BACKENDS, BackendEntry, StepProgram
from fuelpipe.plan.fx_passes import FX_PASSES, FxPass
from fuelpipe.registry import ExtensionLoadError, RegistrationClashError, Registry
from fuelpipe.stages import STAGES
from models.registry import FAMILIES, build_random_model


def test_builtins_come_from_fuelpipes_own_entry_points():
    for registry, names in ((FAMILIES, {"llama", "phi", "qwen3", "gemma3", "deepseek_v2"}),
                            (BACKENDS, {"eager", "fx", "inductor"}),
                            (FX_PASSES, {"fuse_sibling_linears", "split_linears_across_threads"}),
                            (ORACLES, {"plan_vs_replan", "batch_vs_solo"}),
                            (STAGES, {"peers", "context"})):
        assert names <= set(registry.names())
        for name in names:
            assert registry.source(name).distribution == "fuelpipe", (registry.group, name)


def test_checkpoint_architectures_are_listed_by_their_families():
    from fuelpipe.weights.architectures import by_gguf_arch, by_hf_architecture

    assert by_gguf_arch()["llama"].family == "llama"
    assert by_hf_architecture()["Qwen3ForCausalLM"] is FAMILIES.get("qwen3").architectures[0]


def test_in_process_registration_clash_names_both_sources():
    llama = FAMILIES.get("llama")
    with pytest.raises(RegistrationClashError) as err:
        FAMILIES.register(dataclasses.replace(llama, sizes={"x": llama.sizes["tiny"]}))
    message = str(err.value)
    assert "model family 'llama' is registered twice" in message
    assert "distribution 'fuelpipe' (models.llama.family:FAMILY)" in message
    assert "in-process registration (" in message and "test_registry.py" in message


def test_in_process_family_registers_builds_and_unregisters():
    llama = FAMILIES.get("llama")
    entry = dataclasses.replace(llama, name="llama_copy", architectures=())
    FAMILIES.register(entry)
    try:
        model = build_random_model("llama_copy", "tiny")
        assert model.dims.n_layers == 2
        assert FAMILIES.source("llama_copy").distribution is None
    finally:
        FAMILIES.unregister("llama_copy")
    with pytest.raises(ConfigError, match="unknown model family 'llama_copy'"):
        FAMILIES.get("llama_copy")
    with pytest.raises(ConfigError, match="only in-process registrations can be removed"):
        FAMILIES.unregister("llama")


def test_wrong_entry_types_and_names_are_typed():
    with pytest.raises(ExtensionLoadError, match="expected a FxPass"):
        FX_PASSES.register(BackendEntry("x", lambda *a: None))
    with pytest.raises(ExtensionLoadError, match="a name is a non-empty string"):
        FX_PASSES.register(FxPass("", lambda gm: 0))
    with pytest.raises(ConfigError, match="did you mean 'inductor'"):
        BACKENDS.get("inductr")
    with pytest.raises(ConfigError, match="names no sizes"):
        FamilyEntry("empty", int, {})


def test_a_registered_backend_and_pass_are_used_by_name(compose_cfg):
    from fuelpipe.config.validate import validate
    from fuelpipe.runner.assemble import assemble
    from fuelpipe.runner.oracles import run_one

    calls = []

    def count_nodes(gm) -> int:
        calls.append(len(gm.graph.nodes))
        return 0

    def traced_eager(spec, step, step_kind) -> StepProgram:
        calls.append(step_kind)
        return StepProgram("traced_eager", step, None, 0.0)

    with FX_PASSES.swapped(FxPass("count_nodes", count_nodes)), BACKENDS.swapped(BackendEntry("traced_eager", traced_eager)):
        cfg = compose_cfg(["backend.name=traced_eager", "experiment.new_tokens=4"])
        assert validate(cfg) == []
        result = run_one(cfg, assemble(cfg), ORACLES.get("plan_vs_replan"))
        assert result.passed, result.detail
        assert "tensor" in calls or "symbol" in calls  # the registered backend built the plans
        fx_cfg = compose_cfg(["backend.fx_passes=[count_nodes]", "experiment.new_tokens=4"])
        assert validate(fx_cfg) == []
        assert run_one(fx_cfg, assemble(fx_cfg), ORACLES.get("plan_vs_replan")).passed
        assert any(isinstance(c, int) and c > 10 for c in calls)  # the registered pass saw the traced graph
    assert "traced_eager" not in BACKENDS and "count_nodes" not in FX_PASSES
    reasons = validate(compose_cfg(["backend.name=traced_eager"]))
    assert reasons and "unknown backend.name 'traced_eager'" in reasons[0]


# ---- entry points of other distributions (subprocesses: discovery happens once per process) ------
def _fake_distribution(root: Path, name: str, entry_points: str, modules: dict[str, str] = {}) -> Path:
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, cwd=root)


def test_a_distribution_claiming_a_builtin_name_is_a_clash_naming_both(tmp_path):
    root = _fake_distribution(tmp_path, "clashy", """
        [fuelpipe.families]
        llama = clashy_family:FAMILY
        """, {"clashy_family": """
        import dataclasses
        from models.llama.family import FAMILY as LLAMA
        FAMILY = dataclasses.replace(LLAMA, architectures=())
        """})
    run = _run(root, "-c", "from models.registry import families; families()")
    assert run.returncode != 0
    assert "RegistrationClashError: model family 'llama' is registered twice: by distribution 'fuelpipe' " \
           "(models.llama.family:FAMILY) and by distribution 'clashy' (clashy_family:FAMILY)" in run.stderr
    cli = _run(root, "-m", "fuelpipe", "experiment=smoke", f"hydra.run.dir={tmp_path / 'out'}")
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "registered twice" in cli.stdout + cli.stderr and "Traceback" not in cli.stderr


def test_a_broken_plugin_names_itself(tmp_path):
    root = _fake_distribution(tmp_path, "broken", """
        [fuelpipe.oracles]
        mine = broken_oracles:ORACLE
        """, {"broken_oracles": "import not_a_module_anywhere\n"})
    run = _run(root, "-c", "from fuelpipe.oracles.registry import ORACLES; ORACLES.names()")
    assert run.returncode != 0
    assert "ExtensionLoadError: entry point 'mine' of group 'fuelpipe.oracles' from distribution 'broken' " \
           "(broken_oracles:ORACLE) failed to import: ModuleNotFoundError" in run.stderr


def test_registry_without_fuelpipes_entries_says_how_to_install():
    empty = Registry("fuelpipe.no_such_group", "widget", object)
    with pytest.raises(ExtensionLoadError, match=r"fuelpipe is not installed .* pip install -e \."):
        empty.names()
    optional = Registry("fuelpipe.no_such_group", "widget", object, required=False)
    assert optional.names() == ()


# ---- experiment stages registered from outside the package -----------------------------------------
@dataclass
class EchoConfig:
    enabled: bool = False
    repeats: int = 2


def _echo_validate(c) -> list[str]:
    return [] if c.repeats >= 1 else [f"experiment.echo.repeats must be >= 1, got {c.repeats}"]


def _echo_run(c, cfg, asm, output_dirs) -> dict:
    return {"family": cfg.model.family, "words": ["echo"] * c.repeats, "dirs": [str(d) for d in output_dirs]}


def test_a_stage_registered_in_process_gets_a_schema_section_validation_a_run_and_rendering(compose_cfg):
    from fuelpipe.config import register_configs
    from fuelpipe.config.validate import validate
    from fuelpipe.runner.job import run_job
    from fuelpipe.runner.table import render
    from fuelpipe.stages import StageSpec

    stage = StageSpec("echo", EchoConfig, _echo_run, _echo_validate, render=lambda s: "echo: " + " ".join(s["words"]))
    STAGES.register(stage)
    register_configs()
    try:
        bad = compose_cfg(["experiment=bench", "experiment.bench.enabled=false", "experiment.echo.enabled=true",
                           "experiment.echo.repeats=0"])
        assert validate(bad) == ["experiment.echo.repeats must be >= 1, got 0"]
        cfg = compose_cfg(["experiment=bench", "experiment.bench.enabled=false", "experiment.echo.enabled=true",
                           "experiment.echo.repeats=3"])
        doc = run_job(cfg)
        assert doc["status"] == "ok", doc.get("reasons")
        assert doc["echo"] == {"family": "llama", "words": ["echo"] * 3, "dirs": []}
        assert "echo: echo echo echo" in render(doc)
        off = run_job(compose_cfg(["experiment=smoke"]))
        assert "echo" not in off  # a disabled stage writes no section
    finally:
        STAGES.unregister("echo")
        register_configs()
    with pytest.raises(Exception, match="echo"):
        compose_cfg(["experiment.echo.enabled=true"])  # gone from the schema with the stage


def test_an_oracle_registered_from_outside_joins_the_gate_with_its_negative_control(compose_cfg):
    from fuelpipe.oracles.faults import Fault
    from fuelpipe.oracles import plan_vs_replan
    from fuelpipe.oracles.base import OracleResult
    from fuelpipe.oracles.registry import OracleSpec, Tolerance
    from fuelpipe.runner.job import run_job
    from fuelpipe.runner.oracles import enabled_oracles

    def run(inp) -> OracleResult:
        result = plan_vs_replan.run(inp)
        result.name = "outside_parity"
        return result

    from fuelpipe.config import register_configs

    spec = OracleSpec("outside_parity", run, Tolerance.BIT_EXACT, Fault.STALE_OFFSET, enabled_by_default=True)
    ORACLES.register(spec)
    register_configs()  # the schema now holds experiment.oracles.outside_parity
    lean = ["experiment=smoke", "oracles=none", "experiment.oracles.outside_parity.enabled=true",
            "experiment.bench.enabled=false"]
    try:
        # It joins the gate (the list run_job runs), and its enabled switch takes it out again ...
        assert "outside_parity" in enabled_oracles(compose_cfg(["experiment=smoke"]).experiment)
        off = compose_cfg(["experiment=smoke", "experiment.oracles.outside_parity.enabled=false"]).experiment
        assert "outside_parity" not in enabled_oracles(off) and "plan_vs_replan" in enabled_oracles(off)
        # ... and runs: passing on the healthy path, failing with its fault under the negative control.
        doc = run_job(compose_cfg(lean))
        ours = [o for o in doc["oracles"] if o["name"] == "outside_parity"]
        assert len(ours) == 1 and ours[0]["passed"] and doc["status"] == "ok", ours
        control = run_job(compose_cfg([*lean, "experiment.negative_control=true"]))
        ours = [o for o in control["oracles"] if o["name"] == "outside_parity"]
        assert ours and not ours[0]["passed"] and ours[0]["fault"] == Fault.STALE_OFFSET.value
    finally:
        ORACLES.unregister("outside_parity")
        register_configs()


def test_an_oracle_that_passes_under_its_negative_control_makes_the_run_uncaught(compose_cfg):
    """A toothless oracle cannot hide among working ones: its uncaught fault is the run's status (exit 4)."""
    from fuelpipe.config import register_configs
    from fuelpipe.oracles.faults import Fault
    from fuelpipe.oracles.base import OracleResult
    from fuelpipe.oracles.registry import OracleSpec, Tolerance
    from fuelpipe.results import EXIT_CODES, UNCAUGHT
    from fuelpipe.runner.job import run_job
    from fuelpipe.runner.table import render

    def toothless(inp) -> OracleResult:  # checks nothing the fault could change
        return OracleResult("toothless", True, {"checked": 0}, 0.0, "looked at nothing")

    ORACLES.register(OracleSpec("toothless", toothless, Tolerance.BIT_EXACT, Fault.STALE_OFFSET, enabled_by_default=True))
    register_configs()
    # The toothless oracle beside one working one (the whole gate adds nothing to the question, only minutes).
    lean = ["experiment=smoke", "oracles=none", "experiment.oracles.toothless.enabled=true",
            "experiment.oracles.plan_vs_replan.enabled=true", "experiment.bench.enabled=false"]
    try:
        assert run_job(compose_cfg(lean))["status"] == "ok"  # passing normally is fine
        doc = run_job(compose_cfg([*lean, "experiment.negative_control=true"]))
        assert [o["name"] for o in doc["oracles"]] == ["plan_vs_replan", "toothless"]
        assert doc["status"] == UNCAUGHT and EXIT_CODES[UNCAUGHT] == 4  # although the other oracle failed
        assert not doc["oracles"][0]["passed"]
        assert doc["reasons"] == ["oracle toothless did not catch its injected fault 'stale_offset': "
                                  "its negative control passed"]
        assert "PASS (fault NOT caught)" in render(doc)
        one = run_job(compose_cfg([*lean, "experiment.oracles.toothless.inject_fault=true"]))
        assert one["status"] == UNCAUGHT
        caught = run_job(compose_cfg([*lean, "experiment.oracles.plan_vs_replan.inject_fault=true"]))
        assert caught["status"] == "failed" and caught["reasons"] == []
    finally:
        ORACLES.unregister("toothless")
        register_configs()


def test_a_broken_extension_does_not_break_importing_fuelpipe_and_the_cli_exits_2(tmp_path):
    root = _fake_distribution(tmp_path, "broken_stage", """
        [fuelpipe.stages]
        typo = broken_stage_mod:STAGE
        """, {"broken_stage_mod": "import not_a_module_anywhere\n"})
    run = _run(root, "-c", "import fuelpipe.config, fuelpipe.cli; print('imported')")
    assert run.returncode == 0 and "imported" in run.stdout, run.stderr
    cli = _run(root, "-m", "fuelpipe", "experiment=smoke", f"hydra.run.dir={tmp_path / 'out'}")
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "entry point 'typo' of group 'fuelpipe.stages' from distribution 'broken_stage'" in cli.stderr
    assert "Traceback" not in cli.stderr
