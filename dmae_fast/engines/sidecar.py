"""The engine file contract: ``<name>.<ext>`` plus the JSON sidecar ``<name>.<ext>.json``, written by
``dmae-export``: what a runtime needs to feed the engine and a reader needs to trust it (input kind and
shape, the classifier's :class:`ClassifierSpec`, precision, batch range, parity figures against PyTorch,
tool versions, device). Every engine class reads it through :func:`read_sidecar`, which turns any problem
into a one-line :class:`UserError`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmae_fast.base.errors import UserError, raise_first
from dmae_fast.base.integrity import is_sha256
from dmae_fast.model.config import ClassifierSpec

FORMAT = "dmae-fast-engine/1"
KIND_BY_SUFFIX = {".onnx": "onnx", ".engine": "tensorrt", ".plan": "tensorrt", ".pt2": "aoti"}
SUFFIX_BY_KIND = {"onnx": ".onnx", "tensorrt": ".engine", "aoti": ".pt2"}
INPUT_NAMES = {"image": "images", "tokens": "tokens"}
OUTPUT_NAME = "logits"
PRECISIONS = ("fp32", "fp16", "bf16")


def input_shape(spec: ClassifierSpec, input_kind: str) -> tuple[int, ...]:
    """[C, H, W] of an image engine, [1 + L, D] (class token first) of a token engine."""
    if input_kind == "image":
        return spec.input_shape
    return (1 + spec.encoder.grid_size**2, spec.encoder.embed_dim)


@dataclass(frozen=True)
class BatchRange:
    """Batch sizes an engine accepts (TensorRT's optimization profile: min, opt, max)."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise UserError(f"batch range must satisfy 1 <= min <= opt <= max, got {self.min}:{self.opt}:{self.max}")

    @classmethod
    def parse(cls, text: str) -> BatchRange:
        """'MIN:OPT:MAX' (e.g. '1:1000:1024'); a single number N means N:N:N."""
        try:
            values = [int(p) for p in text.split(":")]
        except ValueError:
            values = []
        if len(values) == 1:
            values *= 3
        if len(values) != 3:
            raise UserError(f"--batch must be MIN:OPT:MAX (positive integers, min <= opt <= max), got {text!r}")
        return cls(*values)

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"


@dataclass(frozen=True)
class Parity:
    """How an engine's logits compare with the fp32 PyTorch model on fresh noisy inputs."""

    samples: int
    max_abs_logit_diff: float
    top1_agreement: float
    threshold: float
    reference: str
    device: str
    seed: int | None = None

    @property
    def passed(self) -> bool:
        return self.top1_agreement >= self.threshold and math.isfinite(self.max_abs_logit_diff)

    def summary(self) -> str:
        return (f"top-1 agreement {self.top1_agreement:.2%} (threshold {self.threshold:.1%}), "
                f"max |logit diff| {self.max_abs_logit_diff:.3g} over {self.samples} noisy inputs")


@dataclass(frozen=True)
class Agreement:
    """How often the engine's class differs from the fp32 PyTorch model's on a dataset's images with the smoothing
    noise at ``sigma`` (``dmae-export --check-agreement``): ``disagreements`` of ``samples`` paired noisy inputs
    (``samples_per_image`` on each of ``images``), and ``zeta_upper``, a one-sided Clopper-Pearson bound at level
    1 - ``alpha`` on their average rate: what incremental certification would subtract from pA_lower."""

    data: str
    images: int
    samples_per_image: int
    sigma: float
    seed: int
    disagreements: int
    samples: int
    zeta_upper: float
    alpha: float

    def summary(self) -> str:
        return (f"disagreement with PyTorch on noisy {self.data} images at sigma {self.sigma}: {self.disagreements:,} "
                f"of {self.samples:,}, at most {self.zeta_upper:.3%} (alpha {self.alpha})")


@dataclass(frozen=True)
class EngineMeta:
    """A sidecar, typed. ``file`` is the engine's basename, ``input`` 'image' or 'tokens'."""

    kind: str
    file: str
    input: str
    precision: str
    batch: BatchRange
    spec: ClassifierSpec
    device: str
    source_checkpoint: str
    created: str
    versions: dict[str, str]
    parity: Parity | None = None
    sha256: str | None = None  # of the engine file, written at export, checked on open (None: not recorded)
    agreement: Agreement | None = None  # dmae-export --check-agreement (None: not measured)

    @property
    def input_name(self) -> str:
        return INPUT_NAMES[self.input]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return input_shape(self.spec, self.input)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "kind": self.kind, "file": self.file,
            "input": self.input, "input_name": self.input_name, "input_shape": list(self.input_shape),
            "input_dtype": "float32", "output_name": OUTPUT_NAME, "precision": self.precision,
            "batch": {"min": self.batch.min, "opt": self.batch.opt, "max": self.batch.max},
            "classifier": self.spec.to_json_dict(), "num_classes": self.spec.num_classes, "sigma": self.spec.sigma,
            "patch_size": self.spec.encoder.patch_size,
            "parity": None if self.parity is None else dict(vars(self.parity)), "versions": dict(self.versions),
            "device": self.device, "source_checkpoint": self.source_checkpoint, "created": self.created,
            "sha256": self.sha256, "agreement": None if self.agreement is None else dict(vars(self.agreement)),
        }

    @classmethod
    def from_json_dict(cls, data: Any, where: str) -> EngineMeta:
        """Validate a parsed sidecar; ``where`` names it in the one-line errors."""
        if not isinstance(data, dict):
            raise UserError(f"{where}: not a JSON object")
        if data.get("format") != FORMAT:
            raise UserError(f"{where}: not a dmae-fast engine sidecar "
                            f"(format {data.get('format')!r}, expected {FORMAT!r})")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise UserError(f"{where}: missing field(s) {', '.join(missing)}")
        try:
            spec = ClassifierSpec.from_json_dict(data["classifier"])
            batch = BatchRange(**data["batch"])
            parity = None if data["parity"] is None else Parity(**data["parity"])
            meta = cls(kind=data["kind"], file=data["file"], input=data["input"], precision=data["precision"],
                       batch=batch, spec=spec, device=str(data["device"]),
                       source_checkpoint=str(data["source_checkpoint"]), created=str(data["created"]),
                       versions=dict(data["versions"]), parity=parity, sha256=data.get("sha256"),
                       agreement=None if data.get("agreement") is None else Agreement(**data["agreement"]))
        except UserError as error:
            raise UserError(f"{where}: {error}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise UserError(f"{where}: malformed field ({type(error).__name__}: {error})") from None
        meta._check_consistent(data, where)
        return meta

    def _check_consistent(self, data: dict[str, Any], where: str) -> None:
        checks = [
            (self.kind in SUFFIX_BY_KIND, f"kind {self.kind!r} is not one of {sorted(SUFFIX_BY_KIND)}"),
            (self.input in INPUT_NAMES, f"input {self.input!r} is not 'image' or 'tokens'"),
            (self.precision in PRECISIONS, f"precision {self.precision!r} is not one of {list(PRECISIONS)}"),
            (self.sha256 is None or is_sha256(self.sha256), f"sha256 {self.sha256!r} is not a SHA-256 hex digest"),
        ]
        raise_first(checks, prefix=f"{where}: ")
        sigma = data["sigma"]
        checks = [
            (data["input_name"] == self.input_name, f"input_name {data['input_name']!r} should be {self.input_name!r}"),
            (data["output_name"] == OUTPUT_NAME, f"output_name {data['output_name']!r} should be {OUTPUT_NAME!r}"),
            (data["input_dtype"] == "float32", f"input_dtype {data['input_dtype']!r} should be 'float32'"),
            (tuple(data["input_shape"]) == self.input_shape, f"input_shape {data['input_shape']} does not match the "
             f"classifier's {self.input} input {list(self.input_shape)}"),
            (data["num_classes"] == self.spec.num_classes, f"num_classes {data['num_classes']} differs from the "
             f"classifier's {self.spec.num_classes}"),
            (data["patch_size"] == self.spec.encoder.patch_size, f"patch_size {data['patch_size']} differs from the "
             f"classifier's {self.spec.encoder.patch_size}"),
            (sigma == self.spec.sigma or (sigma is not None and self.spec.sigma is not None
                                          and math.isclose(sigma, self.spec.sigma)),
             f"sigma {sigma} differs from the classifier's {self.spec.sigma}"),
        ]
        raise_first(checks, prefix=f"{where}: ")


_REQUIRED = ("kind", "file", "input", "input_name", "input_shape", "input_dtype", "output_name", "precision",
             "batch", "classifier", "num_classes", "sigma", "patch_size", "parity", "versions", "device",
             "source_checkpoint", "created")


def sidecar_path(engine: Path) -> Path:
    """``model.pt2`` -> ``model.pt2.json``."""
    return engine.with_name(engine.name + ".json")


def read_sidecar(engine: Path) -> EngineMeta:
    """The validated sidecar of an engine file; checks that it describes this very file."""
    path = sidecar_path(engine)
    if not path.is_file():
        raise UserError(f"engine {engine} has no sidecar {path.name} beside it (written by dmae-export; "
                        "it records the input shape, normalization and classes the engine needs)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"sidecar {path} is not valid JSON: {error}") from None
    meta = EngineMeta.from_json_dict(data, f"sidecar {path}")
    if meta.file != engine.name:
        raise UserError(f"sidecar {path} describes {meta.file!r}, not {engine.name!r}")
    expected = KIND_BY_SUFFIX.get(engine.suffix)
    if meta.kind != expected:
        raise UserError(f"sidecar {path} says kind {meta.kind!r} but {engine.name} is a {expected} file")
    return meta


def write_sidecar(engine: Path, meta: EngineMeta) -> Path:
    path = sidecar_path(engine)
    path.write_text(json.dumps(meta.to_json_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def embedded_fields(meta: EngineMeta) -> dict[str, Any]:
    """The facts an engine file carries inside itself (ONNX metadata_props, AOTI package metadata),
    compared with the sidecar on load so that a sidecar cannot be paired with the wrong file."""
    return {"format": FORMAT, "input": meta.input, "input_shape": list(meta.input_shape),
            "num_classes": meta.spec.num_classes, "precision": meta.precision}


EMBEDDED_KEY = "dmae_fast"


def check_embedded(meta: EngineMeta, embedded: str | None, engine: Path) -> None:
    """One-line error when the engine file's embedded facts disagree with its sidecar."""
    if embedded is None:
        raise UserError(f"{engine} carries no dmae_fast metadata: not written by dmae-export")
    try:
        facts = json.loads(embedded)
    except ValueError:
        raise UserError(f"{engine}: unreadable dmae_fast metadata") from None
    expected = embedded_fields(meta)
    differing = [k for k, v in expected.items() if facts.get(k) != v]
    if differing:
        shown = ", ".join(f"{k} {facts.get(k)} vs {expected[k]}" for k in differing)
        raise UserError(f"{engine} and its sidecar disagree ({shown}): the sidecar belongs to another engine")
