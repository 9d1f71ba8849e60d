"""Load a script of ``experiments/`` as a module (they are scripts, not a package)."""
import importlib.util
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load_experiment(name: str):
    """``experiments/<name>.py`` as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
