"""Recording stubs: load Megatron-Bridge perf-recipe source with all heavy deps stubbed,
so that recipe builder functions can be executed offline and every value they set is recorded.
Research-only helper (clustersim validation data extraction)."""
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

LOG = []  # (kind, path, detail)
STUB_PREFIXES = ("megatron", "nemo_run", "torch", "omegaconf", "transformer_engine", "transformers",
                 "modelopt", "nvidia", "numpy", "einops", "datasets", "hydra", "wandb", "yaml",
                 "safetensors", "huggingface_hub", "accelerate", "nvidia_resiliency_ext", "tensorstore",
                 "zarr", "PIL", "qwen_vl_utils", "timm", "open_clip", "mamba_ssm", "causal_conv1d",
                 "flash_attn", "filelock", "requests", "tqdm", "regex", "sentencepiece", "tiktoken",
                 "jinja2", "packaging", "pydantic", "psutil", "rich", "typer", "fiddle", "lightning",
                 "nemo", "tokenizers", "scipy", "pandas", "cv2", "decord", "av", "librosa", "soundfile",
                 "diffusers", "imageio", "megatron_fsdp", "emerging_optimizers", "onnx", "mlflow",
                 "tensorboard", "comet_ml", "boto3", "multistorageclient", "ray", "fsspec", "h5py",
                 "cloudpickle", "dill", "triton", "apex", "te", "nvtx", "cuda", "pynvml", "click")


class Unknown:
    pass


class R:
    """A recorded config node. Unset reads yield child nodes flagged unknown."""

    def __init__(self, path, vals=None, unknown=False, ctor=None, args=()):
        object.__setattr__(self, "_p", path)
        object.__setattr__(self, "_v", dict(vals or {}))
        object.__setattr__(self, "_unknown", unknown)
        object.__setattr__(self, "_ctor", ctor)
        object.__setattr__(self, "_args", args)

    def __getattr__(self, n):
        if n.startswith("__") and n.endswith("__"):
            raise AttributeError(n)
        v = object.__getattribute__(self, "_v")
        if n in v:
            return v[n]
        c = R(f"{self._p}.{n}", unknown=True)
        v[n] = c
        return c

    def __setattr__(self, n, val):
        LOG.append(("set", f"{self._p}.{n}", val))
        self._v[n] = val

    def __delattr__(self, n):
        self._v.pop(n, None)

    def __call__(self, *a, **k):
        LOG.append(("call", self._p, (a, k)))
        return R(f"{self._p}()", unknown=True)

    def __bool__(self):
        if self._unknown:
            LOG.append(("bool-unknown", self._p, None))
            return False
        return True

    def __eq__(self, o):
        if self._unknown:
            LOG.append(("cmp-unknown", self._p, o))
        return self is o

    def __ne__(self, o):
        if self._unknown:
            LOG.append(("cmp-unknown", self._p, ("!=", o)))
            return False
        return self is not o

    __hash__ = object.__hash__

    def __iter__(self):
        return iter([])

    def __len__(self):
        return 0

    def __contains__(self, x):
        return False

    def __getitem__(self, k):
        return R(f"{self._p}[{k!r}]", unknown=True)

    def __setitem__(self, k, v):
        LOG.append(("set", f"{self._p}[{k!r}]", v))

    def __repr__(self):
        return f"<R {self._p}>"

    def _num(self, *a):
        LOG.append(("num-unknown", self._p, a))
        return 1

    __int__ = __index__ = lambda self: 1
    __float__ = lambda self: 1.0
    __mul__ = __rmul__ = __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __truediv__ = __mod__ = _num
    __rtruediv__ = __rfloordiv__ = __rmod__ = _num
    __lt__ = __le__ = __gt__ = __ge__ = lambda self, o: False

    def get(self, k, d=None):
        return d

    def items(self):
        return []

    def copy(self):
        return self


class StubMeta(type):
    def __call__(cls, *a, **k):
        if cls.__dict__.get("_stub"):
            name = cls.__dict__.get("_qual", cls.__name__)
            LOG.append(("ctor", name, (a, k)))
            if a and isinstance(a[0], R) and not k and len(a) <= 3:
                return a[0]  # helper fn that mutates and returns its first arg
            return R(f"{name}()", vals=k, ctor=name, args=a)
        return super().__call__(*a, **k)

    def __instancecheck__(cls, inst):
        if cls.__dict__.get("_stub"):
            return isinstance(inst, R) and (inst._ctor is None or inst._ctor.split(".")[-1] == cls.__name__)
        return super().__instancecheck__(inst)

    def __subclasscheck__(cls, sub):
        if cls.__dict__.get("_stub"):
            return False
        return super().__subclasscheck__(sub)

    def __getattr__(cls, n):
        if n.startswith("__") and n.endswith("__"):
            raise AttributeError(n)
        return make_stub(f"{cls.__dict__.get('_qual', cls.__name__)}.{n}")

    def __getitem__(cls, k):
        if isinstance(k, str):
            return make_stub(f"{cls.__dict__.get('_qual', cls.__name__)}.{k}")
        return cls

    def __or__(cls, o):
        return cls

    def __ror__(cls, o):
        return cls

    def __repr__(cls):
        return f"<stub {cls.__dict__.get('_qual', cls.__name__)}>"

    def __iter__(cls):
        return iter([])

    def __bool__(cls):
        return True


def make_stub(qual):
    return StubMeta(qual.split(".")[-1], (), {"_stub": True, "_qual": qual})


class StubModule(types.ModuleType):
    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []
        self.__file__ = f"<stub {name}>"
        self.__all__ = []

    def __getattr__(self, n):
        if n.startswith("__") and n.endswith("__"):
            raise AttributeError(n)
        s = make_stub(f"{self.__name__}.{n}")
        setattr(self, n, s)
        return s


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, src_root, real_prefixes, real_exact):
        self.src_root = src_root  # dir containing 'megatron/'
        self.real_prefixes = real_prefixes
        self.real_exact = real_exact

    def _is_real(self, name):
        return name in self.real_exact or any(name == p or name.startswith(p + ".") for p in self.real_prefixes)

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in STUB_PREFIXES:
            return None
        if self._is_real(name):
            rel = name.replace(".", "/")
            pkg = os.path.join(self.src_root, rel, "__init__.py")
            mod = os.path.join(self.src_root, rel + ".py")
            if os.path.exists(pkg):
                return importlib.util.spec_from_file_location(
                    name, pkg, submodule_search_locations=[os.path.dirname(pkg)])
            if os.path.exists(mod):
                return importlib.util.spec_from_file_location(name, mod)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        pass


_orig_fields = dataclasses.fields


def _fields(x):
    if isinstance(x, R) or (isinstance(x, StubMeta) and x.__dict__.get("_stub")) or (
            isinstance(type(x), StubMeta) and type(x).__dict__.get("_stub")):
        return ()
    return _orig_fields(x)


dataclasses.fields = _fields


def install(src_root, real_prefixes=("megatron.bridge.recipes", "megatron.bridge.perf_recipes"),
            real_exact=()):
    for k in list(sys.modules):
        if k.split(".")[0] in STUB_PREFIXES or k.split(".")[0] in ("configs", "utils", "argument_parser",
                                                                      "perf_plugins", "argument_builder"):
            del sys.modules[k]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
    f = Finder(src_root, real_prefixes, real_exact)
    sys.meta_path.insert(0, f)
    LOG.clear()
    return f


def fmt(v, depth=0):
    if isinstance(v, R):
        if v._unknown and not v._v:
            return "<unset>"
        d = {k: fmt(x, depth + 1) for k, x in v._v.items() if not (isinstance(x, R) and x._unknown and not x._v)}
        if v._ctor:
            d["__ctor__"] = v._ctor
            if v._args:
                d["__args__"] = [fmt(a, depth + 1) for a in v._args]
        return d
    if isinstance(v, StubMeta):
        return f"<{v.__dict__.get('_qual', v.__name__)}>"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        d = {f.name: fmt(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v)}
        for k, x in getattr(v, "__dict__", {}).items():
            if k not in d and not k.startswith("_"):
                d[k] = fmt(x, depth + 1)
        d["__ctor__"] = type(v).__name__
        return d
    if isinstance(v, enum.Enum):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [fmt(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): fmt(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if callable(v):
        return f"<fn {getattr(v, '__qualname__', repr(v))}>"
    return repr(v)


def flatten(d, prefix=""):
    out = {}
    if isinstance(d, dict) and "__ctor__" not in d or (isinstance(d, dict) and prefix == ""):
        for k, v in d.items():
            p = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and v and k != "env_vars":
                out.update(flatten(v, p))
            else:
                out[p] = v
        return out
    if isinstance(d, dict):
        for k, v in d.items():
            p = f"{prefix}.{k}"
            if isinstance(v, dict) and v and k != "env_vars":
                out.update(flatten(v, p))
            else:
                out[p] = v
        return out
    return {prefix: d}


def set_gpu(gpu):
    """Emulate torch.cuda device queries for the target GPU (Blackwell = SM100)."""
    name = {"b200": "NVIDIA B200", "gb200": "NVIDIA GB200", "b300": "NVIDIA B300", "gb300": "NVIDIA GB300",
            "h100": "NVIDIA H100 80GB HBM3"}[gpu]
    major = 9 if gpu == "h100" else 10
    props = types.SimpleNamespace(major=major, minor=0, name=name, multi_processor_count=148 if major == 10 else 132)
    import importlib as _il
    torch = _il.import_module("torch")
    cuda = torch.cuda
    setattr(cuda, "get_device_properties", staticmethod(lambda *a, **k: props))
    setattr(cuda, "get_device_name", staticmethod(lambda *a, **k: name))
    setattr(cuda, "get_device_capability", staticmethod(lambda *a, **k: (major, 0)))
    setattr(cuda, "is_available", staticmethod(lambda *a, **k: True))


def release_tree(argv):
    """``(ref, out, root, perf)`` of an extraction run ``extract_*.py REF OUT.json``: the tag,
    the output file, the tag's unpacked tree (``$MB_TREES/<ref>``, default ``/tmp/mb``, made
    with ``git archive``) and its ``scripts/performance`` folder, put on ``sys.path``."""
    ref, out = argv[1], argv[2]
    root = os.path.join(os.environ.get("MB_TREES", "/tmp/mb"), ref)
    perf = os.path.join(root, "scripts", "performance")
    sys.path.insert(0, perf)
    return ref, out, root, perf
