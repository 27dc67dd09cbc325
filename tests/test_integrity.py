"""Model-file integrity: content hashes written with every model file the project makes,
checked on load; run records name the hash of the model they certified."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from test_engines import CERTIFY, certify, one_line, tiny_checkpoint

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import CONTENT_KEY, file_sha256, tensors_sha256
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.front_end import front_end_path, load_front_end
from dmae_fast.engines.sidecar import read_sidecar, sidecar_path
from dmae_fast.export import ExportConfig, export_engines
from dmae_fast.model.checkpoints import load_classifier, read_checkpoint

pytestmark = pytest.mark.usefixtures("two_torch_threads")


def flip_middle(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of a file (a damaged download or disk)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + count] = bytes(b ^ 0xFF for b in data[middle:middle + count])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """An image and a token ONNX engine of the demo model (with their sidecars and front end)."""
    folder = tmp_path_factory.mktemp("engines")
    paths = {}
    for kind in ("image", "tokens"):
        config = ExportConfig("demo", str(folder), ("onnx",), name=f"demo-{kind}", input=kind,
                              parity_samples=64, seed=0)
        paths[kind] = export_engines(config, report=lambda line: None)[0]
    return paths


def _copy(engine: Path, folder: Path) -> Path:
    target = folder / engine.name
    for source, destination in ((engine, target), (sidecar_path(engine), sidecar_path(target)),
                                (front_end_path(engine), front_end_path(target))):
        if source.is_file():
            shutil.copy(source, destination)
    return target


def test_export_records_the_engine_files_hash(exported):
    for engine in exported.values():
        assert read_sidecar(engine).sha256 == file_sha256(engine)


def test_a_damaged_engine_is_refused_in_one_line(capsys, exported, tmp_path):
    engine = _copy(exported["image"], tmp_path)
    flip_middle(engine)
    line = one_line(certify(capsys, *CERTIFY, "--engine", engine, "--out", tmp_path / "r.tsv"), engine.name,
                    "SHA-256 differs", "sidecar")
    assert "export it again" in line
    assert not (tmp_path / "r.tsv").exists()


def test_an_engine_whose_sidecar_has_no_hash_still_opens_and_is_named_in_the_record(capsys, exported, tmp_path):
    engine = _copy(exported["image"], tmp_path)
    sidecar = sidecar_path(engine)
    data = json.loads(sidecar.read_text())
    del data["sha256"]  # a sidecar written before hashes were recorded
    sidecar.write_text(json.dumps(data))
    rc = certify(capsys, *CERTIFY, "--engine", engine, "--out", tmp_path / "r.tsv").rc
    assert rc == 0
    assert json.loads((tmp_path / "r.tsv.json").read_text())["model_sha256"] == file_sha256(engine)


def test_a_malformed_hash_in_a_sidecar_is_one_line(capsys, exported, tmp_path):
    engine = _copy(exported["image"], tmp_path)
    data = json.loads(sidecar_path(engine).read_text())
    data["sha256"] = "not-a-digest"
    sidecar_path(engine).write_text(json.dumps(data))
    one_line(certify(capsys, *CERTIFY, "--engine", engine, "--out", tmp_path / "r.tsv"), "sha256", "hex digest")


def test_a_damaged_front_end_of_a_token_engine_is_refused(exported, tmp_path):
    engine = _copy(exported["tokens"], tmp_path)
    front = front_end_path(engine)
    with safetensors.safe_open(str(front), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    assert metadata[CONTENT_KEY] == tensors_sha256(tensors)
    tensors["pos_embed"][0, 0, 0] += 1.0  # one weight changed, the stored hash kept
    safetensors.torch.save_file(tensors, str(front), metadata=metadata)
    with pytest.raises(UserError, match="do not match the content hash"):
        load_front_end(engine, read_sidecar(engine))


def test_a_bit_flipped_checkpoint_is_refused_in_one_line(capsys, tmp_path):
    checkpoint = tmp_path / "demo.safetensors"
    shutil.copy(DEMO_CHECKPOINT, checkpoint)
    flip_middle(checkpoint)
    one_line(certify(capsys, *CERTIFY, "--ckpt", checkpoint, "--out", tmp_path / "r.tsv"), "demo.safetensors",
             "do not match the content hash")


def test_saved_classifiers_and_the_shipped_demo_carry_their_weights_hash(tmp_path):
    path = tiny_checkpoint(tmp_path / "tiny.safetensors")
    for checkpoint in (path, DEMO_CHECKPOINT):
        with safetensors.safe_open(str(checkpoint), framework="pt") as handle:
            stored = handle.metadata()[CONTENT_KEY]
        assert stored == tensors_sha256(read_checkpoint(checkpoint).state)
    load_classifier(path)  # opens


def test_a_checkpoint_without_a_hash_still_loads(tmp_path):
    path = tiny_checkpoint(tmp_path / "tiny.safetensors")
    with safetensors.safe_open(str(path), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if k != CONTENT_KEY}
    safetensors.torch.save_file(safetensors.torch.load_file(str(path)), str(path), metadata=metadata)
    assert load_classifier(path).spec.num_classes == 10


def test_a_damaged_pretraining_checkpoint_is_refused(tmp_path):
    state = {"mask_token": torch.zeros(1, 1, 4), "decoder_embed.weight": torch.ones(4, 4)}
    torch.save({"model": state, "args": {}, CONTENT_KEY: tensors_sha256(state)}, tmp_path / "ok.pt")
    assert read_checkpoint(tmp_path / "ok.pt").state.keys() == state.keys()
    state["decoder_embed.weight"][0, 0] = 2.0
    torch.save({"model": state, "args": {}, CONTENT_KEY: tensors_sha256({**state, "decoder_embed.weight":
                                                                          torch.ones(4, 4)})}, tmp_path / "bad.pt")
    with pytest.raises(UserError, match="bad.pt: its weights do not match the content hash"):
        read_checkpoint(tmp_path / "bad.pt")


def test_the_run_record_names_the_certified_files_hash(capsys, tmp_path):
    rc = certify(capsys, *CERTIFY, "--out", tmp_path / "r.tsv").rc
    assert rc == 0
    assert json.loads((tmp_path / "r.tsv.json").read_text())["model_sha256"] == file_sha256(DEMO_CHECKPOINT)
