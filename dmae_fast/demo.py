"""The embedded demo: a small ViT classifier for scikit-learn's 8x8 digits, trained here.

The model mirrors the paper's CIFAR-10 set-up at toy scale: noise is added to the 8x8
images (radii are in 8x8 [0, 1] pixel units), the classifier normalizes and resizes them
to 16x16 (bicubic) and runs a 4-block ViT with 4x4 patches. Training is plain Gaussian
noise augmentation (sigma 0.25) on the 1,297 training digits; the 500 test digits are only
ever certified. Rebuild the shipped weights with ``python -m dmae_fast.demo``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dmae_fast.checkpoints import save_classifier
from dmae_fast.data import demo_digits
from dmae_fast.model import ENCODER_PRESETS, ClassifierSpec, SmoothingClassifier

DEMO_CHECKPOINT = Path(__file__).parent / "assets" / "demo-digits-vit.safetensors"


@dataclass(frozen=True)
class DemoRecipe:
    sigma: float = 0.25
    epochs: int = 60
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    seed: int = 0


def train_demo_model(recipe: DemoRecipe = DemoRecipe(), progress: bool = True) -> SmoothingClassifier:
    """Train the demo classifier with Gaussian noise augmentation (deterministic on CPU)."""
    torch.manual_seed(recipe.seed)
    train = demo_digits("train")
    images, labels = train.images, train.labels
    spec = ClassifierSpec(
        encoder=ENCODER_PRESETS["demo"],
        num_classes=10,
        input_size=images.shape[-1],
        mean=tuple(round(v, 4) for v in images.mean(dim=(0, 2, 3)).tolist()),
        std=tuple(round(v, 4) for v in images.std(dim=(0, 2, 3)).tolist()),
        sigma=recipe.sigma,
        class_names=tuple(str(d) for d in range(10)),
        provenance={
            "trained_by": "dmae_fast.demo.train_demo_model",
            "recipe": asdict(recipe),
            "data": "scikit-learn load_digits, demo train split (1,297 images)",
            "torch": torch.__version__,
        },
    )
    model = SmoothingClassifier(spec).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps = recipe.epochs * -(-len(images) // recipe.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, recipe.lr, total_steps=steps, pct_start=0.1)
    bar = tqdm(total=steps, desc="training demo model", disable=not progress)
    for _ in range(recipe.epochs):
        for batch in torch.randperm(len(images)).split(recipe.batch_size):
            x = images[batch] + recipe.sigma * torch.randn_like(images[batch])
            loss = F.cross_entropy(model(x), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description="Retrain the embedded demo classifier.")
    parser.add_argument("--out", type=Path, default=DEMO_CHECKPOINT, help="where to write it")
    args = parser.parse_args()
    start = time.perf_counter()
    model = train_demo_model()
    save_classifier(model, args.out)
    test = demo_digits("test")
    with torch.no_grad():
        accuracy = (model(test.images).argmax(1) == test.labels).float().mean().item()
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s; clean test accuracy {accuracy:.1%}")


if __name__ == "__main__":
    main()
