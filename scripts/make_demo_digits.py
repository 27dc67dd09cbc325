"""Write ``dmae_fast/assets/demo-digits.safetensors``: scikit-learn's 8x8 digits, as stored.

The 1,797 images of ``sklearn.datasets.load_digits`` (the UCI "Optical Recognition of
Handwritten Digits" test set, CC BY 4.0) in its order, as uint8 grey levels 0-16
(``images``, [1797, 8, 8]) and their classes (``labels``, [1797]). The package reads them
without importing scikit-learn (half a second on a 2-core CPU); ``tests/test_data.py``
checks the file against scikit-learn's copy.

    python scripts/make_demo_digits.py
"""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parents[1] / "dmae_fast" / "assets" / "demo-digits.safetensors"


def main() -> None:
    digits = load_digits()
    images = digits.images.astype(np.uint8)
    assert np.array_equal(images, digits.images) and digits.target.max() < 256  # whole grey levels, 10 classes
    save_file({"images": images, "labels": digits.target.astype(np.uint8)}, OUT,
              metadata={"source": "sklearn.datasets.load_digits (UCI optdigits, CC BY 4.0)", "levels": "0-16"})
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
