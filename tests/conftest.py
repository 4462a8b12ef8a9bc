"""Fixtures shared by several test modules."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_cifar_fpo import TINY_UNET  # noqa: E402

import cifar_fpo  # noqa: E402


@pytest.fixture(scope="module")
def tiny_train(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_unet")
    torch.manual_seed(0)
    cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config(TINY_UNET), folder, dtype=torch.float32)
    return cifar_fpo.Args(
        model=str(folder),
        preset="quick",
        reward="red-patch",
        device="cpu",
        batch_size=4,
        group_size=2,
        mc_draws=2,
        sample_steps=2,
        val_every=2,
        val_banks=1,
        val_bank_size=4,
        calib_bank_size=8,
        fit_batch_size=4,
        learning_rate=1e-3,
        verbose=False,
        save_samples=False,
        estimator="q+Z",
        early_stop=False,
    )
