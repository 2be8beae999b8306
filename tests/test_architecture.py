"""The package's layout as the README draws it: stages import only from earlier stages, no cycles,
no lazy import without a stated reason, no torch for `reskip --help` and `reskip report`, and
nothing changed in the user's process by importing reskip."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "reskip"

# The data's way through the package: each stage imports only from stages at or before its own.
STAGES = {
    # the ground floor: errors, atomic writes, the cache, version differences, the loss terms, the options' fields
    "reskip.errors": 0, "reskip.io_atomic": 0, "reskip.cache": 0, "reskip.compat": 0, "reskip.losses": 0,
    "reskip.version": 0, "reskip.divergences": 0, "reskip.run_folder": 0, "reskip.memory": 0, "reskip.fusion": 0,
    "reskip.progress": 0, "reskip.config_fields": 0, "reskip.device_names": 0, "reskip.reading": 0, "reskip.machine_load": 0,
    "reskip.run_folder.lock": 0, "reskip.lora_ranks": 0, "reskip.run_folder.versions": 0, "reskip.html_tables": 0,
    "reskip.statistics": 0,
    "reskip.ar_retrofit": 1,
    "reskip.backbones": 2, "reskip.train_config": 2, "reskip.options": 2, "reskip.compress.options": 2,
    "reskip.compress.export_options": 2,
    "reskip.data": 3, "reskip.chat": 3,
    "reskip.train": 4,
    "reskip.skip": 5,
    # the product's healing, blocks and export: the one trainer's LoRA recipe, opened by the evaluator as kinds
    "reskip.compress": 6,
    "reskip.evaluate": 7,
    # the product's measurement, report and command, over the evaluator
    "reskip.compress.measure": 8, "reskip.compress.report": 8, "reskip.compress.speed": 8,
    "reskip.compress.run": 8,
    "reskip.research": 9,  # the source design's pipeline, calibration, analyses, experiments, lab and run report
    "reskip.stages": 10,  # one floor: every command's entry, the same shape
    "reskip.cli": 11,
    "reskip": 12,  # the package root re-exports public names (lazily)
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_of(module: str) -> int:
    while module not in STAGES:
        module = module.rpartition(".")[0]
        if not module:
            raise AssertionError("module outside every stage")
    return STAGES[module]


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported reskip module, line, inside a function) for every import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        lazy = id(node) in in_function
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, lazy) for a in node.names if a.name.split(".")[0] == "reskip"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "reskip":
                continue
            # `from . import compat` imports a module; `from .x import name` imports module x
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if module_exists(sub) else target, node.lineno, lazy))
    return out


def module_exists(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in SRC.rglob("*.py")}


def test_every_module_belongs_to_a_stage():
    for name in all_modules():
        stage_of(name)


def test_no_import_from_a_later_stage():
    bad = []
    for name, path in all_modules().items():
        for target, line, _ in imports_of(path):
            if stage_of(target) > stage_of(name):
                bad.append(f"{name}:{line} imports {target} (stage {stage_of(target)} > {stage_of(name)})")
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_cli():
    bad = [f"{name}:{line}" for name, path in all_modules().items() if not name.startswith("reskip.cli")
           for target, line, _ in imports_of(path) if target.startswith("reskip.cli")]
    assert not bad


# Rooms that keep to one trade: what each may import from the package besides stage-0 modules and itself.
ROOMS = {
    "reskip.skip": ("reskip.ar_retrofit", "reskip.backbones", "reskip.train_config", "reskip.options",
                    "reskip.data"),  # the inference path, and the data it reads: no training
    "reskip.backbones": ("reskip.options",),  # loading only (the dtypes' names come from the options' module)
}


def test_rooms_keep_to_their_trade():
    bad = []
    for name, path in all_modules().items():
        room = next((r for r in ROOMS if name == r or name.startswith(r + ".")), None)
        if room is None:
            continue
        allowed = (room, *ROOMS[room])
        for target, line, _ in imports_of(path):
            inside = any(target == a or target.startswith(a + ".") for a in allowed)
            if not inside and stage_of(target) > 0:
                bad.append(f"{name}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = {name: {t for t, _, _ in imports_of(path) if t != name} for name, path in all_modules().items()}
    # A module importing its own package's __init__ is not a cycle of ideas; every __init__ here is a docstring.
    state: dict[str, int] = {}
    cycles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_the_walker_sees_a_cycle_and_a_backward_import(tmp_path, monkeypatch):
    """The checks above can fail: a retrofit module importing skip/ is caught."""
    fake = tmp_path / "reskip"
    (fake / "ar_retrofit").mkdir(parents=True)
    (fake / "skip").mkdir()
    for f in ("__init__.py", "ar_retrofit/__init__.py", "skip/__init__.py"):
        (fake / f).write_text("")
    (fake / "ar_retrofit" / "model.py").write_text("from ..skip import runtime\n")
    (fake / "skip" / "runtime.py").write_text("from ..ar_retrofit import model\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    with pytest.raises(AssertionError, match="imports reskip.skip.runtime"):
        test_no_import_from_a_later_stage()
    with pytest.raises(AssertionError, match="reskip.ar_retrofit.model -> reskip.skip.runtime"):
        test_no_import_cycles()


def test_every_lazy_import_states_its_reason():
    """An import inside a function carries `# lazy: <reason>` on its line or the line above."""
    bad = []
    for path in SRC.rglob("*.py"):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(f):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here = lines[node.lineno - 1] + lines[node.lineno - 2]
                    if "# lazy:" not in here:
                        bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, "\n".join(bad)


def _fresh(code: str, env_drop=("HF_HUB_OFFLINE",)) -> str:
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                          timeout=120).stdout.strip()


def test_help_and_report_import_no_torch(tmp_path):
    run = tmp_path / "run"
    (run / "experiments").mkdir(parents=True)  # an experiments folder, no stage yet (an empty folder is refused)
    out = _fresh(
        "import sys\nfrom reskip.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "help_torch = 'torch' in sys.modules\n"
        f"assert main(['report', {str(run)!r}]) == 0\n"
        "print(help_torch, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    assert out.splitlines()[-1] == "False False False"
    assert (run / "report" / "report.html").is_file()


def test_importing_reskip_changes_nothing_in_the_process():
    out = _fresh("import os\nimport reskip, reskip.backbones.loading, reskip.ar_retrofit.model, reskip.cli\n"
                 "print(os.environ.get('HF_HUB_OFFLINE'))")
    assert out == "None"


def test_public_names_of_the_readme_resolve():
    import reskip
    import reskip.ar_retrofit.model  # noqa: F401 - importing the subpackage must not shadow the function
    from reskip import (
        AdapterError,
        ModelNotFoundError,
        ReskipError,
        ReskipModel,
        ReskipOutput,
        RetrofitConfig,
        UnsupportedModelError,
        alpha_entropy,
        load_adapter,
        load_backbone,
        retrofit,
        save_adapter,
    )
    assert callable(reskip.retrofit) and reskip.retrofit is retrofit
    assert all(callable(x) for x in (load_adapter, load_backbone, save_adapter, alpha_entropy))
    assert issubclass(AdapterError, ReskipError) and issubclass(ModelNotFoundError, ReskipError)
    assert issubclass(UnsupportedModelError, ReskipError) and ReskipModel and ReskipOutput and RetrofitConfig
    with pytest.raises(AttributeError):
        reskip.no_such_name  # noqa: B018


def test_the_front_door_holds_the_reskip_half_and_loads_lazily():
    assert _fresh("import sys, reskip; print('torch' in sys.modules)") == "False"
    from reskip import (
        CalibrateOptions,
        EvalOptions,
        calibrate_run,
        evaluate_run,
        generate_text,
        open_run,
        parse_spec,
        score,
    )

    assert all(callable(f) for f in (calibrate_run, evaluate_run, generate_text, open_run, parse_spec, score))
    assert parse_spec("reskip:budget=1").kind == "reskip" and CalibrateOptions() and EvalOptions()


def test_functions_and_modules_stay_short():
    """No function in src/ over 60 lines and no module over 500: one idea each, readable on a screen."""
    long_functions, long_modules = [], []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 500:
            long_modules.append(f"{path.relative_to(SRC)} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} "
                                      f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long_functions, long_functions
    assert not long_modules, long_modules
