"""The cost model file format (`"schema": "costmodel/1"`): read, validate, write atomically.

`read_document` parses a file; `from_document` validates a parsed document and builds the
model. Every problem is a ValueError naming the file, what is wrong and what to do.
`write_json_atomic` writes so that a reader never sees half a file. Numpy/scipy only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.curves import MODES, AttentionCurve, ModeCurves, TokenCurve
from costmodel.flops import MAX_LENGTH
from costmodel.spec import ModelSpec

if TYPE_CHECKING:
    from costmodel.model import CostModel

__all__ = [
    "SCHEMA", "atomic_output", "check_output_path", "from_document", "read_document",
    "utc_timestamp", "write_json_atomic",
]

logger = logging.getLogger(__name__)

#: How to use a cost model made for another model shape anyway, in every entry point.
OTHER_SHAPE_HINT = ("to use it anyway: load_cost_model(..., allow_other_shape=True) in Python, "
                    "--cost-model-allow-other-shape on the command line and in training scripts")


class UnknownCostModel(ValueError):
    """`load_cost_model` was given a name that is no file and no GPU/model name (a typo), as
    opposed to a cost model it found that does not fit or does not load."""


def is_unknown_name(err: BaseException) -> bool:
    """Whether a `load_cost_model` error says the name resolved to nothing."""
    return isinstance(err, (FileNotFoundError, UnknownCostModel))

SCHEMA = "costmodel/1"
_REQUIRED_FIELDS = ("schema", "created", "is_estimate", "gpu", "spec", "spec_fingerprint", "curves")
_EXTRA_FIELDS = (
    "created", "command", "device", "kernels", "measurements", "residuals", "flops_check",
    "validation",
)
# The JSON type of each optional field when present (readers such as `report` rely on it).
_OPTIONAL_TYPES: dict[str, type] = {
    "created": str, "command": str, "provenance": Mapping, "device": Mapping,
    "kernels": Mapping, "measurements": list, "residuals": Mapping, "flops_check": Mapping,
    "validation": Mapping,
}
_JSON_TYPE_NAMES: dict[type, str] = {str: "a string", Mapping: "an object", list: "a list"}
_FLOAT_MAX = int(sys.float_info.max)
MAX_TENSOR_PARALLEL = 1024  # ranks; beyond any model's heads, and what a file may say
_REWRITE = "write a new file with `costmodel calibrate` (or restore this one)"


def utc_timestamp() -> str:
    """Now, in UTC, to the second (ISO 8601): the `created` field of a file."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


# ---- reading and writing --------------------------------------------------------------------
def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def read_document(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a cost model file, with errors that say which file and where."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # a BOM, as some editors save it, is dropped
    except UnicodeDecodeError:
        raise _fail(str(p), "not a text file (binary data?), so not a cost model") from None
    if not text.strip():
        raise _fail(str(p), "file is empty (an interrupted write?)")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _fail(str(p), "JSON nested too deeply to be a cost model") from None
    except json.JSONDecodeError as err:
        hint = " (truncated?)" if err.pos >= len(text.rstrip()) - 1 else ""
        raise _fail(
            str(p),
            f"not valid JSON{hint}: {err.msg} at line {err.lineno} column {err.colno} "
            f"(char {err.pos} of {len(text)})",
        ) from None
    except ValueError as err:  # NaN / Infinity literals: parse them to say where they are
        try:
            doc = json.loads(text)
        except ValueError:  # or a number past Python's digit limit
            raise _fail(str(p), f"not valid JSON: {err}") from None
        _check_finite(doc, str(p))
        raise


def check_output_path(path: str | os.PathLike, flag: str = "output") -> Path:
    """`path` as a Path if a file can be written there; else a ValueError naming `flag`.

    Commands call this before any work, so a bad -o fails at once (not after minutes of
    measuring), and `atomic_output` runs the same checks (less the temp-file probe, as it
    writes one itself) so a rename never replaces a directory, a device (/dev/null) or a
    pipe.
    """
    return _checked_output_path(path, flag, probe=True)


def _checked_output_path(path: str | os.PathLike, flag: str, *, probe: bool) -> Path:
    """`check_output_path`; without ``probe`` no temp file is tried (for `atomic_output`,
    which creates its own in the same folder at once)."""
    if not os.fspath(path).strip():
        raise ValueError(f"{flag} is empty; give a file path")
    try:
        return _check_output_path(Path(path), flag, probe)
    except OSError as err:  # the checks themselves fail: a name too long, a broken mount
        raise ValueError(f"{flag} {path}: cannot write there ({err.strerror})") from None


def _check_output_path(target: Path, flag: str, probe: bool) -> Path:
    if target.is_dir():
        raise ValueError(f"{flag} {target} is a directory; give a file name inside it")
    if target.exists() and not target.is_file():
        raise ValueError(f"{flag} {target} is not a regular file (a device or a pipe?); "
                         "give a file path")
    folder = target.parent if str(target.parent) else Path(".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {target}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{flag} {target}: no permission to write in {existing}")
    if len(os.fsencode(target.name)) > _name_max(existing):
        raise ValueError(f"{flag} {target}: the file name is longer than this filesystem "
                         "allows; give a shorter one")
    if probe:  # a temp file like `atomic_output`'s, where the folder chain starts to exist
        # (/proc and other filesystems that take no new files fail here, not at the end)
        fd, tmp = _create_temp(existing)
        os.close(fd)
        os.unlink(tmp)
    return target


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):  # no pathconf (Windows), or unknown
        return 255


def _create_temp(folder: Path) -> tuple[int, Path]:
    """A new empty file ``folder/.costmodel-XXXXXXXX.tmp``, opened for writing: (fd, path).

    Created with mode 0o666, so the umask applies as to any file a program writes (not
    mkstemp's 0600, and without setting the process-wide umask to read it). The name does
    not grow with the target's, so a long target name cannot make it too long."""
    for _ in range(100):
        path = folder / f".costmodel-{secrets.token_hex(4)}.tmp"
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name in {folder}")


def write_json_atomic(path: str | os.PathLike, doc: Mapping[str, Any]) -> Path:
    """Write JSON so that readers see the old file or the whole new one, never a part
    (`atomic_output`; the text is also fsynced before the rename)."""
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"  # serialise before touching disk
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """A temp file in ``path``'s folder (same filesystem) for the block to write; renamed
    over ``path`` when the block ends without error, removed when it fails or is
    interrupted. The file gets the mode a plain write would (an existing file's, else what
    the umask allows), not mkstemp's 0600."""
    target = _checked_output_path(path, "output", probe=False)  # the temp file below probes
    folder = target.parent if str(target.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(folder)
    except OSError as err:  # a folder that takes no files (/proc): name the target, not a temp
        raise ValueError(f"{target}: cannot write there ({err.strerror or err})") from None
    os.close(fd)
    try:
        yield tmp
        if target.exists():  # a rewrite keeps the file's mode
            with contextlib.suppress(PermissionError):  # some filesystems refuse chmod
                os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ---- validation -------------------------------------------------------------------------------
def _fail(source: str, message: str, *, fix: str | None = _REWRITE) -> ValueError:
    """One line: which file, what is wrong with it, and what to do."""
    return ValueError(f"cost model {source}: {message}" + (f"; {fix}" if fix else ""))


def _check_finite(obj: Any, source: str, where: str = "") -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise _fail(source, f"non-finite number {obj!r} at {where or 'top level'} "
                    "(cost model files hold finite numbers only)")
    if isinstance(obj, int) and not -_FLOAT_MAX <= obj <= _FLOAT_MAX:
        raise _fail(source, f"number with {len(str(abs(obj)))} digits at {where or 'top level'}, "
                    "past any float (cost model files hold finite numbers only)")
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _check_finite(v, source, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_finite(v, source, f"{where}[{i}]")


def _shape_difference(file_spec: ModelSpec, spec: ModelSpec, most: int = 4) -> str:
    """The fields that differ, file's value first: what a fingerprint alone does not say."""
    mine, theirs = file_spec.to_dict(), spec.to_dict()
    layout = ("moe_layers", "first_k_dense_layers", "moe_layer_freq")  # compared as one below
    diff = [f"{k} {mine[k]!r} vs {theirs[k]!r}" for k in mine
            if k != "name" and k not in layout and mine[k] != theirs[k]]
    if file_spec.moe_layer_ids() != spec.moe_layer_ids():
        diff.append(f"MoE layers {list(file_spec.moe_layer_ids())[:6]} vs "
                    f"{list(spec.moe_layer_ids())[:6]}")
    more = f", and {len(diff) - most} more" if len(diff) > most else ""
    return ("differs in " + ", ".join(diff[:most]) + more) if diff else "the same fields, laid out differently"


def _require(mapping: Any, key: str, kind: type | tuple[type, ...], source: str, where: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise _fail(source, f"missing field {where}{key!r}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _fail(source, f"field {where}{key!r} has the wrong type {type(value).__name__} "
                    f"(expected {' or '.join(_JSON_TYPE_NAMES.get(k, k.__name__) for k in kinds)})")
    return value


def _mode_from_dict(d: Any, mode: str, source: str) -> ModeCurves:
    where = f"curves.{mode}."
    if not isinstance(d, Mapping):
        raise _fail(source, f"{where[:-1]} must be an object")
    overhead = _require(d, "overhead", Mapping, source, where)
    per_layer = _require(overhead, "per_layer_ms", (int, float), source, where + "overhead.")
    per_mb = _require(overhead, "per_microbatch_ms", (int, float), source, where + "overhead.")
    attn = _require(d, "attention", Mapping, source, where)
    linear = _require(d, "linear", Mapping, source, where)
    head = _require(d, "head", Mapping, source, where)

    def curve(cls, block: Mapping, xkey: str, name: str):
        xs = _require(block, xkey, list, source, f"{where}{name}.")
        ys = _require(block, "ms", list, source, f"{where}{name}.")
        kind = block.get("interpolation", cls.interpolation)
        if kind != cls.interpolation:  # a file from another tool or version: not read as ours
            raise _fail(source, f"{where}{name}.interpolation is {kind!r:.40}, but this costmodel "
                        f"reads {cls.interpolation!r} curves only")
        try:
            built = cls(xs, ys, what=f"{where}{name}")
        except (ValueError, TypeError) as err:
            raise _fail(source, str(err)) from None
        _note_derived_fields(built, block, source, f"{where}{name}.")
        return built

    if not linear:
        raise _fail(source, f"{where}linear has no curves (need 'dense' and/or 'moe')")
    unknown = sorted(set(linear) - {"dense", "moe"})
    if unknown:
        raise _fail(source, f"{where}linear has unknown kinds {unknown}; allowed: dense, moe")
    # The curves first: each reports its own errors with the file's name.
    attention = curve(AttentionCurve, attn, "lengths", "attention")
    linear_curves = {k: curve(TokenCurve, v, "tokens", f"linear.{k}") for k, v in linear.items()}
    head_curve = curve(TokenCurve, head, "tokens", "head")
    try:
        return ModeCurves(attention=attention, linear=linear_curves, head=head_curve,
                          layer_overhead_ms=float(per_layer), microbatch_overhead_ms=float(per_mb))
    except ValueError as err:  # what is left to check: the overheads' bounds
        raise _fail(source, f"{where}overhead: {err}") from None


def _note_derived_fields(curve: Any, block: Mapping, source: str, where: str) -> None:
    """Warn when a stored field that the curve derives from its knots (the attention
    extrapolation exponents) says something else: a hand edit there would do nothing."""
    for key in ("low_exponent", "tail_exponent"):
        stored, derived = block.get(key), getattr(curve, key, None)
        if stored is None or derived is None:
            continue
        same = isinstance(stored, (int, float)) and not isinstance(stored, bool) and abs(stored - derived) <= 1e-6
        if not same:
            logger.warning("%s: %s%s is %.40r, but it follows from the knots (%.4g) and is not "
                           "read; change the knots (or recalibrate) to change the curve",
                           source, where, key, stored, derived)


def from_document(
    cls: type[CostModel], doc: Any, *, source: str, spec: ModelSpec | None, allow_other_shape: bool
) -> CostModel:
    """Validate a parsed document and build a `cls` (a CostModel) from it.

    `cls` is passed in, not imported, so that this module sits below `costmodel.model`.
    """
    if not isinstance(doc, Mapping):
        raise _fail(source, f"expected a JSON object at top level, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema is None:
        raise _fail(source, f"missing field 'schema' (expected {SCHEMA!r}): not a cost model file?")
    if schema != SCHEMA:
        raise _fail(
            source,
            f"unsupported schema {schema!r}; this version of costmodel reads {SCHEMA!r} only "
            "(re-run `costmodel calibrate` to write a current file, or upgrade costmodel)",
            fix=None,
        )
    missing = [k for k in _REQUIRED_FIELDS if k not in doc]
    if missing:
        raise _fail(source, f"missing field(s) {missing} (file truncated or hand-edited?)")
    try:
        _check_finite(doc, source)
    except RecursionError:
        raise _fail(source, "JSON nested too deeply to be a cost model") from None
    for key, kind in _OPTIONAL_TYPES.items():
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            raise _fail(source, f"field {key!r} must be {_JSON_TYPE_NAMES[kind]}, got "
                        f"{type(doc[key]).__name__}")
    spec_doc = _require(doc, "spec", Mapping, source, "")
    try:
        file_spec = ModelSpec.from_dict(spec_doc)
    except ValueError as err:
        raise _fail(source, f"invalid model spec: {err}") from None
    fingerprint = _require(doc, "spec_fingerprint", str, source, "")
    if fingerprint != file_spec.fingerprint():
        raise _fail(
            source,
            f"spec_fingerprint {fingerprint} does not match its own spec "
            f"({file_spec.fingerprint()}): the file was edited or is corrupt",
        )
    other_shape = spec is not None and spec.shape_key() != file_spec.shape_key()
    if other_shape and not allow_other_shape:
        assert spec is not None  # other_shape says so
        raise _fail(
            source,
            f"made for model {file_spec.name!r} (shape {file_spec.fingerprint()}), not for "
            f"{spec.name!r} (shape {spec.fingerprint()}: {_shape_difference(file_spec, spec)}"
            f"); calibrate for this model ({OTHER_SHAPE_HINT})",
            fix=None,
        )
    gpu = _require(doc, "gpu", Mapping, source, "")
    gpu_name = _require(gpu, "name", str, source, "gpu.")
    if not gpu_name.strip():  # it labels every table and is checked against the device
        raise _fail(source, "gpu.name is empty; it names the GPU the file was measured on")
    is_estimate = _require(doc, "is_estimate", bool, source, "")
    curves_doc = _require(doc, "curves", Mapping, source, "")
    if not curves_doc:
        raise _fail(source, "'curves' is empty")
    unknown = sorted(set(curves_doc) - set(MODES))
    if unknown:
        raise _fail(source, f"unknown modes {unknown} in 'curves'; allowed: {list(MODES)}")
    curves = {m: _mode_from_dict(curves_doc[m], m, source) for m in MODES if m in curves_doc}
    optional: dict[str, Any] = {}  # absent: the CostModel default
    if "reference_tokens" in doc:
        reference = doc["reference_tokens"]
        whole = isinstance(reference, int) and not isinstance(reference, bool)
        if not whole or not 1 <= reference <= MAX_LENGTH:
            raise _fail(source, f"reference_tokens must be a whole number of tokens in 1.."
                        f"{MAX_LENGTH:,}, got {reference!r:.40}")
        optional["reference_tokens"] = reference
    # Absent in files from before them: one GPU's whole layer; experts split as TP.
    for key in ("tensor_parallel", "expert_tensor_parallel"):
        if key in doc:
            ways = doc[key]
            whole = isinstance(ways, int) and not isinstance(ways, bool)
            if not whole or not 1 <= ways <= MAX_TENSOR_PARALLEL:
                raise _fail(source, f"{key} must be a whole number in 1..{MAX_TENSOR_PARALLEL}, "
                            f"got {ways!r:.40}")
            optional[key] = ways
    # Optional (older files lack it), but `report` and `correct` read it as a string.
    gpu_key = None if gpu.get("key") is None else _require(gpu, "key", str, source, "gpu.")
    extra = {k: doc.get(k) for k in _EXTRA_FIELDS}
    extra["source"] = source
    try:
        model = cls(
            spec=file_spec,
            gpu=gpu_name,
            gpu_key=gpu_key,
            curves=curves,
            is_estimate=is_estimate,
            provenance=doc.get("provenance") or {},
            extra=extra,
            **optional,
        )
    except ValueError as err:
        raise _fail(source, str(err)) from None
    # Allowed above; said only now that the file is known to be whole (it was logged
    # before a broken file's error).
    if other_shape:
        assert spec is not None  # other_shape says so
        logger.warning(
            "%s: using a cost model made for %s (shape %s) for %s (shape %s); its curves are "
            "those of %s", source, file_spec.name, file_spec.fingerprint(), spec.name,
            spec.fingerprint(), file_spec.name,
        )
    model.accept_shape_of(spec)
    return model

