"""The reference of an incremental run (``dmae-certify --reference REF.tsv``): its rows and run record, read and
checked before anything is written, with its votes where it kept them (``--keep-votes``); without votes its
classifier is opened beside the derived engine as one :class:`~dmae_fast.engines.paired.PairedEngine`
(docs/certify.md, "Incremental certification")."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import file_sha256
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.classifier import open_classifier
from dmae_fast.engines.base import Engine
from dmae_fast.engines.paired import PairedEngine
from dmae_fast.noise.sound_options import Sound
from dmae_fast.results.checks import row_problems
from dmae_fast.results.format import read_results
from dmae_fast.results.votes import Votes, read_votes
from dmae_fast.run.config import CertifyConfig
from dmae_fast.stats.decisions import FIXED_N, Certificate
from dmae_fast.stats.incremental_procedure import SCRATCH_ABOVE, IncrementalCertify
from dmae_fast.stats.procedure import Procedure
from dmae_fast.stats.rounded_gaussian import sound_table, tv_per_image

DATA_SETTINGS = ("data", "split", "labels", "image_size")  # the images must be the reference's


@dataclass(frozen=True)
class Reference:
    """A completed fixed-n CERTIFY run: its results file, resolved settings and certificates by image."""

    path: str
    config: CertifyConfig  # the reference run's settings, as recorded (resolved)
    certificates: dict[int, Certificate]
    results_sha256: str
    model_sha256: str
    votes: Votes | None = None  # its votes on its first estimation samples, where it kept them

    @property
    def where(self) -> str:
        return f"--reference {self.path}"

    def resolve(self, config: CertifyConfig) -> CertifyConfig:
        """``config`` with the reference's sigma (a different ``--sigma`` refused) and, unless given, its paired
        samples (its votes per image where it kept them, else its n / 5) and, without a disagreement rate, the
        pA_lower above which images are certified from scratch; with votes, its seed (the votes are on its noise;
        another ``--seed`` refused)."""
        procedure = config.procedure
        if self.votes is None and config.body.body == "fast":
            raise UserError(f"--reference on a reference without votes runs the plain body (the reference and the "
                            f"derived engine classify the same noisy images); drop {config.body.reason}")
        given, own = procedure.sigma, self.config.procedure.sigma
        if given is not None and given != own:
            raise UserError(f"--sigma {given} differs from the sigma of {self.where} ({own})")
        if config.sound != self.config.sound:
            raise UserError(f"{self.where} drew its noise {_noise_words(self.config.sound)}, this run "
                            f"{_noise_words(config.sound)}: both must draw the same noise")
        scratch = procedure.scratch_above
        if scratch is None and procedure.disagreement_rate is None:
            scratch = SCRATCH_ABOVE
        seed = procedure.seed
        if self.votes is None:
            paired = procedure.paired_samples or max(1, self.config.procedure.n // 5)
        else:
            kept, seed = self.votes.samples, self.config.procedure.seed
            paired = procedure.paired_samples or kept
            if paired > kept:
                raise UserError(f"--paired-samples {paired} exceeds the {kept} votes per image that {self.where} "
                                "kept")
            if procedure.seed is not None and procedure.seed != seed:
                raise UserError(f"--seed {procedure.seed}: an incremental run on the votes of {self.where} draws "
                                f"its noise (seed {seed}); drop --seed")
        return dataclasses.replace(config, procedure=dataclasses.replace(procedure, sigma=own, paired_samples=paired,
                                                                         scratch_above=scratch, seed=seed))

    def check_run(self, config: CertifyConfig, indices: list[int]) -> None:
        """Refuse a run on other images than the reference's: its data settings, and an image without a reference
        row."""
        mine, theirs = config.recorded(), self.config.recorded()
        for key in DATA_SETTINGS:
            if mine[key] != theirs[key]:
                raise UserError(f"{self.where} was run with {key} {theirs[key]!r}, this run has {mine[key]!r}: the "
                                "images must be the reference's")
        missing = [index for index in indices if index not in self.certificates]
        if missing:
            raise UserError(f"{self.where} has no row for image idx {missing[0]} ({len(missing)} of this run's "
                            f"{len(indices)} images have none): use the reference's --skip and --max")

    def check_derived(self, config: CertifyConfig, model_sha256: str) -> None:
        """Refuse a derived classifier that is the reference's own: its file, opened the same way."""
        mine, theirs = config.classifier, self.config.classifier
        if model_sha256 == self.model_sha256 and dataclasses.replace(mine, device="") == dataclasses.replace(
                theirs, engine_path=mine.engine_path, device=""):
            raise UserError(f"the classifier to certify is that of {self.where} itself (the same file, precision and "
                            "input); certify a derived one (an export, another --precision) against it")

    def engine(self, derived: Engine, device: str) -> Engine:
        """What the run classifies with: ``derived`` alone where the reference kept votes, else paired with the
        reference's classifier (:meth:`paired_engine`)."""
        return derived if self.votes is not None else self.paired_engine(derived, device)

    def paired_engine(self, derived: Engine, device: str) -> PairedEngine:
        """The reference's classifier file (refused if it changed since its run), opened as it ran, paired with
        ``derived``. A relative path the record names is looked for here, then beside the reference's results."""
        classifier = self.config.classifier
        recorded = Path(classifier.engine_path)
        found = [p for p in dict.fromkeys((recorded, Path(self.path).parent / recorded)) if p.is_file()]
        if not found:
            raise UserError(f"{self.where}: its classifier {recorded} is missing (looked here and beside "
                            f"{self.path})")
        path = next((p for p in found if file_sha256(p) == self.model_sha256), None)
        if path is None:
            raise UserError(f"{self.where}: its classifier {found[0]} changed since the reference run (its SHA-256 "
                            "differs from the run record's)")
        reference = open_classifier(str(path), BodyOptions(), device, classifier.precision, classifier.input_size,
                                    classifier.normalize)
        return PairedEngine(reference, derived)

    def procedure(self, config: CertifyConfig, classes: int) -> IncrementalCertify:
        procedure = config.procedure
        return IncrementalCertify(config.procedure_spec(), self.certificates, self.config.procedure.alpha, classes,
                                  SCRATCH_ABOVE if procedure.scratch_above is None else procedure.scratch_above,
                                  None if self.votes is None else self.votes.by_image, procedure.disagreement_rate)

    def sound_terms(self, elements: int) -> dict[str, float]:
        """What a ``--sound`` incremental run adds to its stated failure probability for the reference's bound: its
        alpha and the total variation of its noise (its n0 + n samples of ``elements`` values, docs/sound.md)."""
        procedure, sound = self.config.procedure, self.config.sound
        assert sound is not None and procedure.sigma is not None
        return {"reference_alpha": procedure.alpha, "reference_tv_per_image": tv_per_image(
            sound_table(procedure.sigma, sound.grid), procedure.n0 + procedure.n, elements)}

    def summary(self) -> dict:
        """What an incremental run's record says of its reference."""
        votes = {} if self.votes is None else {"votes_sha256": self.votes.sha256, "votes": self.votes.samples}
        return {"path": self.path, "results_sha256": self.results_sha256, "model_sha256": self.model_sha256,
                "alpha": self.config.procedure.alpha, "n": self.config.procedure.n, "seed": self.config.procedure.seed,
                **votes}


def read_reference(path: str) -> Reference:
    """Read and check the reference ``path``: a completed fixed-n CERTIFY run whose results file is the one its run
    record digested, every row consistent with the recorded settings; UserError naming the problem otherwise."""
    where = f"--reference {path}"
    if not Path(path).is_file():
        raise UserError(f"{where}: no such results file")
    try:
        record = json.loads(Path(path + ".json").read_text())
    except (OSError, ValueError):
        raise UserError(f"{where}: its run record {path}.json is missing or not JSON") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise UserError(f"{where}: {path}.json is not a run record")
    if record.get("status") != "complete":
        raise UserError(f"{where}: its run record says {record.get('status')!r}; a reference is a completed run")
    digest = record.get("results_sha256")
    if not isinstance(digest, str):
        raise UserError(f"{where}: its run record holds no digest of the results (an older run); certify the "
                        "reference again")
    if file_sha256(path) != digest:
        raise UserError(f"{where} was edited after its run (its SHA-256 differs from the run record's)")
    procedure_name = str(record.get("procedure", "")).removesuffix(" sound")
    if procedure_name != FIXED_N:
        raise UserError(f"{where} was made by the procedure {procedure_name or '(none recorded)'}; a reference is a "
                        "fixed-n CERTIFY run (not --predict, --sequential or incremental)")
    config = CertifyConfig.from_settings(record["config"])
    table = read_results(path)
    if table.radius is None:
        raise UserError(f"{where} is not a CERTIFY results file")
    radii = table.radius
    rules = Procedure(config.procedure_spec()).rules()
    for row, problem in row_problems(table, rules):
        raise UserError(f"{where}: the row of image idx {table.idx[row]} {problem}")
    repeated = table.duplicate_indices()
    if repeated:
        raise UserError(f"{where}: image idx {repeated[0]} appears in more than one row")
    extra = table.extra
    certificates = {int(i): Certificate(int(table.predict[r]), float(radii[r]), int(extra["n0"][r]), int(extra["n"][r]),
                                        int(extra["nA"][r]), float(extra["pA_lower"][r]))
                    for r, i in enumerate(table.idx)}
    return Reference(path, config, certificates, digest, str(record.get("model_sha256")),
                     _recorded_votes(where, path, record, certificates))


def _recorded_votes(where: str, path: str, record: dict, certificates: dict[int, Certificate]) -> Votes | None:
    """The votes the reference kept (None: it kept none), read from beside it and checked against its record."""
    recorded = record.get("votes")
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
        raise UserError(f"{where}: its run record's votes entry is not one dmae-certify --keep-votes writes")
    votes_file = str(Path(path).parent / str(recorded.get("path")))
    if not Path(votes_file).is_file():
        raise UserError(f"{where}: its votes file {votes_file} is missing")
    if file_sha256(votes_file) != recorded["sha256"]:
        raise UserError(f"{where}: its votes file {votes_file} was edited after its run (its SHA-256 differs from the "
                        "run record's)")
    votes = dataclasses.replace(read_votes(votes_file), sha256=recorded["sha256"])
    missing = [index for index in certificates if index not in votes.by_image]
    if votes.samples != recorded.get("samples") or missing:
        raise UserError(f"{where}: its votes file {votes_file} does not match its rows (N or an image's votes)")
    return votes


def _noise_words(sound: Sound | None) -> str:
    if sound is None:
        return "without --sound"
    return f"with --sound on the 1/{sound.grid} grid" + (" (--quantize)" if sound.quantize else "")
