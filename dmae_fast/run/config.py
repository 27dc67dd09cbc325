"""The configuration of a ``dmae-certify`` run in small typed parts, and its validation; light (no torch),
so the command checks its options before loading anything. The run record keeps the settings flat (one key
per setting, as the command spells it): :meth:`CertifyConfig.recorded` writes them, ``from_settings`` reads them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dmae_fast.base.errors import UserError, raise_first
from dmae_fast.batching.body_options import BodyOptions, how, is_how
from dmae_fast.batching.choices import SHARD_CHOICES
from dmae_fast.demo_files import DEMO, DEMO_HAS_LABELS
from dmae_fast.model.config import sigma_problem
from dmae_fast.noise.sound_options import Sound, default_grid
from dmae_fast.stats.settings import FUTILITY_MODES, SEQUENTIAL_TESTS

if TYPE_CHECKING:
    from dmae_fast.stats.procedure import ProcedureSpec

PROG = "dmae-certify"  # the command a CertifyConfig is the command line of
MAX_BATCH = 2**20  # noisy samples per forward pass; far beyond any device's memory at 224x224
SETTING_OF_SPEC = {"test": "sequential_test"}  # a ProcedureSpec field -> the setting that gives it, where they differ
SETTING_OF_FIELD = {"engine_path": "engine"}  # an options field -> its setting (the command's word), where they differ
BODY_SETTINGS = {"fast": "fast", "body_reason": "reason", "fused": "fused", "compile": "compile",
                 "cuda_graphs": "cuda_graphs", "noise": "noise", "cpu_runtime": "cpu_runtime"}  # setting -> field


@dataclass(frozen=True)
class ClassifierOptions:
    """The classifier: a checkpoint or engine file, and where and how it runs."""

    engine_path: str  # the setting ``engine`` (``--engine`` / ``--ckpt``)
    device: str = how("auto")  # the same classifier on any device; its precision must match
    precision: str = "auto"
    input_size: int | None = None  # None: the checkpoint's
    normalize: str | None = None  # None: the checkpoint's, else imagenet

    def validate(self) -> None:
        input_size = self.input_size
        raise_first([(input_size is None or input_size >= 1, f"--input-size must be >= 1, got {input_size}")])


@dataclass(frozen=True)
class DataOptions:
    """The images: a dataset and which of its images."""

    data: str  # "demo", a directory or a list file
    split: str = "test"
    labels: str | None = None
    image_size: int | None = None  # None: the classifier's input size
    skip: int = 1
    max_images: int | None = None
    workers: int | None = how(None)  # DataLoader processes (None: by the data and the device)

    def validate(self) -> None:
        raise_first([
            (self.image_size is None or self.image_size >= 1, f"--image-size must be >= 1, got {self.image_size}"),
            (self.skip >= 1, f"--skip must be >= 1, got {self.skip}"),
            (self.max_images is None or self.max_images >= 1, f"--max must be >= 1, got {self.max_images}"),
            (self.workers is None or self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (self.data != DEMO or self.labels is None, DEMO_HAS_LABELS),
        ])


@dataclass(frozen=True)
class ProcedureOptions:
    """What is proven: the procedure (CERTIFY, PREDICT, sequential) and its settings."""

    sigma: float | None = None  # None: the sigma the checkpoint records
    n0: int = 100
    n: int = 10_000
    alpha: float = 0.001
    seed: int | None = None  # None: a fresh 64-bit seed from the OS (a continued run: its recorded one)
    predict: bool = False
    sequential: bool = False
    looks: tuple[int, ...] | None = None
    futility: str | None = None  # None: the sequential test's own default (exact: upper; bonferroni: deterministic)
    sequential_test: str = "exact"
    grow: float | None = None  # None: the exact test's default (dmae_fast.stats.group_sequential.GROW); inf: off
    procedure_name: str | None = None  # a registered procedure's key; None: the one predict / sequential name
    reference: str | None = None  # incremental CERTIFY against this reference run's results file
    paired_samples: int | None = None  # its paired samples per image (None: the reference's n / 5, once read)
    scratch_above: float | None = None  # from scratch above this reference pA_lower (None: 0.99, once read)
    disagreement_rate: float | None = None  # each image's paired samples chosen for this expected rate (instead)
    # summary radii (how); radii of interest with --sequential (must match when the procedure reads them)
    radii: tuple[float, ...] | None = how(None)

    @property
    def key(self) -> str:
        """The key of the registered procedure these settings ask for (known before a reference is read)."""
        from dmae_fast.stats.incremental_procedure import INCREMENTAL

        return INCREMENTAL if self.reference is not None else self.spec(sound=False).key

    def spec(self, sound: bool) -> ProcedureSpec:
        """What these settings ask for (``sigma`` as resolved so far)."""
        from dmae_fast.stats.procedure import CERTIFY, PREDICT, ProcedureSpec

        if self.predict:
            return ProcedureSpec(PREDICT, self.n, self.alpha, self.sigma, name=self.procedure_name, sound=sound)
        if self.reference is not None:
            if self.paired_samples is None:
                raise ValueError("an incremental run's paired samples are resolved once its reference is read")
            return ProcedureSpec(CERTIFY, self.paired_samples, self.alpha, self.sigma, 0, name=self.key, sound=sound)
        return ProcedureSpec(CERTIFY, self.n, self.alpha, self.sigma, self.n0, self.sequential, self.radii,
                             self.looks, self.futility, self.sequential_test, self.grow, self.procedure_name, sound)

    def validate(self) -> None:
        raise_first([
            (self.sigma is None or sigma_problem(self.sigma) is None, f"--{sigma_problem(self.sigma)}"),
            (0 < self.alpha < 1, f"--alpha must be in (0, 1), got {self.alpha}"),
            (self.n0 >= 1, f"--n0 must be >= 1, got {self.n0}"),
            (1 <= self.n < 2**32, f"--n must be in [1, 2**32), got {self.n}"),
            (self.seed is None or 0 <= self.seed < 2**64, f"--seed must be in [0, 2**64), got {self.seed}"),
            (all(math.isfinite(r) and r >= 0 for r in self.radii or ()), "--radii must be finite and >= 0"),
            (not (self.sequential and self.predict), "--sequential applies to CERTIFY, not --predict"),
            (self.sequential_test in SEQUENTIAL_TESTS,
             f"--sequential-test must be one of {', '.join(SEQUENTIAL_TESTS)}, got {self.sequential_test!r}"),
            (self.sequential or (self.looks is None and self.futility is None and self.sequential_test == "exact"),
             "--looks, --futility and --sequential-test apply to --sequential; add --sequential"),
            (self.grow is None or (self.sequential and self.sequential_test == "exact"),
             "--grow applies to --sequential with the exact test (the default --sequential-test)"),
            (self.grow is None or self.grow >= 0, f"--grow must be >= 0 or off, got {self.grow}"),
            (self.futility is None or self.futility in FUTILITY_MODES,
             f"--futility must be one of {', '.join(FUTILITY_MODES)}, got {self.futility!r}"),
            (self.reference is None or not (self.predict or self.sequential or self.procedure_name),
             "--reference certifies with paired samples; it excludes --predict and --sequential"),
            (self.paired_samples is None and self.scratch_above is None and self.disagreement_rate is None
             or self.reference is not None, "--paired-samples, --scratch-above and --disagreement-rate apply to "
             "--reference"),
            (self.disagreement_rate is None or 0 < self.disagreement_rate < 1,
             f"--disagreement-rate must be in (0, 1), got {self.disagreement_rate}"),
            (self.disagreement_rate is None or self.scratch_above is None,
             "--disagreement-rate chooses which images are certified from scratch; drop --scratch-above"),
            (self.scratch_above is None or 0 <= self.scratch_above <= 1,
             f"--scratch-above must be in [0, 1], got {self.scratch_above}"),
            (self.paired_samples is None or 1 <= self.paired_samples < 2**32,
             f"--paired-samples must be in [1, 2**32), got {self.paired_samples}"),
        ])
        if self.procedure_name is not None:  # a procedure registered by its module (no command option names one)
            from dmae_fast.stats.procedure import registered

            named = registered(self.procedure_name)
            if self.sequential or named.kind != self.spec(sound=False).kind:
                raise UserError(f"procedure_name {named.key} is a {named.kind.upper()} procedure: it needs "
                                f"predict={named.kind != 'certify'} and sequential=False")


@dataclass(frozen=True)
class OutputOptions:
    """Where the rows and the run record go, and what the run shows while it runs."""

    out: str = how()  # the results file; its run record is <out>.json
    overwrite: bool = how(False)
    resume: bool = how(False)
    progress: bool = how(True)
    profile: str | None = how(None)  # directory for a torch profiler trace + per-stage table
    keep_votes: int | None = None  # a fixed-n CERTIFY run's votes on its first N estimation samples, in <out>.votes

    def validate(self) -> None:
        raise_first([(not (self.overwrite and self.resume), "--overwrite and --resume exclude each other"),
                     (self.keep_votes is None or self.keep_votes >= 1,
                      f"--keep-votes must be >= 1, got {self.keep_votes}")])


_BODY_FIELDS = {f.name: f for f in dataclasses.fields(BodyOptions)}
PARTS = {"classifier": ClassifierOptions, "data": DataOptions, "procedure": ProcedureOptions, "output": OutputOptions}
# the flat settings beside the body's (BODY_SETTINGS): the parts' fields, the run's and --sound's
def _setting(field: dataclasses.Field) -> str:
    return SETTING_OF_FIELD.get(field.name, field.name)


SETTINGS = frozenset({_setting(f) for part in PARTS.values() for f in dataclasses.fields(part)}
                     | {"batch", "shard", "sound", "quantize"})


@dataclass(frozen=True)
class CertifyConfig:
    """One certification run (the command line, resolved), in parts."""

    classifier: ClassifierOptions
    data: DataOptions
    procedure: ProcedureOptions
    output: OutputOptions
    body: BodyOptions = field(default_factory=BodyOptions)  # the batch body (the record's "body": the one that ran)
    sound: Sound | None = None  # --sound (and --quantize): the noise on the inputs' grid; None: Gaussian noise
    batch: int = how(1000)  # noisy samples per forward pass
    shard: str = how("images")  # under torchrun: "images" (ranks claim images) or "samples" (ranks split each image's)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], body: BodyOptions | None = None) -> CertifyConfig:
        """The config of flat settings (the run record's keys; ``engine``, ``data`` and ``out`` required,
        the rest defaulted), with ``body`` (else the body settings among them); ``sound`` and ``quantize``
        give its :class:`Sound` on the data's default grid."""
        if settings.get("grow") == "off":
            settings = {**settings, "grow": math.inf}
        unknown = sorted(set(settings) - SETTINGS - set(BODY_SETTINGS))
        if unknown:
            raise UserError(f"unknown certification settings: {', '.join(unknown)}")
        if settings.get("quantize") and not settings.get("sound"):
            raise UserError("--quantize applies to --sound; add --sound")
        parts = {name: part(**{f.name: settings[_setting(f)] for f in dataclasses.fields(part)
                               if _setting(f) in settings})
                 for name, part in PARTS.items()}
        if body is None:
            body = BodyOptions(**{field: settings[key] for key, field in BODY_SETTINGS.items()
                                  if settings.get(key) is not None})
        demo = settings["data"] == "demo"
        sound = Sound(default_grid(demo), bool(settings.get("quantize"))) if settings.get("sound") else None
        run = {key: settings[key] for key in ("batch", "shard") if key in settings}
        return cls(**parts, body=body, sound=sound, **run)  # type: ignore[arg-type]

    def recorded(self) -> dict:
        """The settings as the run record writes them, flat (``procedure_name`` only when one is named)."""
        settings = {_setting(f): getattr(getattr(self, name), f.name) for name, part in PARTS.items()
                    for f in dataclasses.fields(part)}
        settings.update({key: getattr(self.body, field) for key, field in BODY_SETTINGS.items()})
        sound = self.sound
        settings.update(batch=self.batch, shard=self.shard, sound=sound is not None,
                        quantize=sound is not None and sound.quantize)
        if self.procedure.procedure_name is None:
            del settings["procedure_name"]
        if settings["grow"] == math.inf:
            settings["grow"] = "off"  # JSON has no infinity
        return settings

    def resolved(self, sigma: float, precision: str) -> CertifyConfig:
        """This config with the sigma and the precision the classifier resolved."""
        return dataclasses.replace(self, procedure=dataclasses.replace(self.procedure, sigma=sigma),
                                   classifier=dataclasses.replace(self.classifier, precision=precision))

    def procedure_spec(self) -> ProcedureSpec:
        """What this run asks for (``sigma`` as resolved so far)."""
        return self.procedure.spec(self.sound is not None)

    def must_match(self) -> tuple[str, ...]:
        """The recorded settings a run must share with the rows it continues: every setting that is not
        :func:`~dmae_fast.batching.body_options.how` (so the noise, the classifier's input and every decision),
        and those its procedure reads; not the seed when none is given (the run takes the recorded one)."""
        parts = (*PARTS.values(), CertifyConfig)
        how_settings = {_setting(f) for part in parts for f in dataclasses.fields(part) if is_how(f)}
        how_settings |= {key for key, name in BODY_SETTINGS.items() if is_how(_BODY_FIELDS[name])}
        read = set(self.procedure_settings())
        settings = [key for key in sorted(SETTINGS | set(BODY_SETTINGS)) if key not in how_settings or key in read]
        return tuple(key for key in settings if not (key == "seed" and self.procedure.seed is None))

    def procedure_settings(self) -> tuple[str, ...]:
        """The settings of this run that its procedure's results depend on beyond n, n0, alpha and sigma."""
        from dmae_fast.stats.procedure import registered

        return tuple(SETTING_OF_SPEC.get(field, field) for field in registered(self.procedure.key).reads)

    def validate(self) -> None:
        for name in PARTS:
            getattr(self, name).validate()
        raise_first([
            (1 <= self.batch <= MAX_BATCH, f"--batch must be in [1, {MAX_BATCH:,}], got {self.batch}"),
            (self.shard in SHARD_CHOICES, f"--shard must be one of {', '.join(SHARD_CHOICES)}, got {self.shard!r}"),
        ])
        self.body.validate()
        if self.output.keep_votes is not None:
            self._check_keep_votes(self.output.keep_votes)
        if self.sound is not None:
            self.sound.validate(self.procedure.sigma)

    def _check_keep_votes(self, samples: int) -> None:
        """--keep-votes: a fixed-n CERTIFY run, at most --n votes per image."""
        procedure = self.procedure
        raise_first([
            (not (procedure.predict or procedure.sequential or procedure.reference or procedure.procedure_name),
             "--keep-votes keeps a fixed-n CERTIFY run's votes (a reference for --reference); it excludes --predict, "
             "--sequential and --reference"),
            (samples <= procedure.n, f"--keep-votes {samples} exceeds --n {procedure.n}: the votes are those of the "
                                     "first estimation samples"),
        ])
