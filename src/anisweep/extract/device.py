"""The torch device extract runs on, or an error that says where it is missing and what to change."""

from __future__ import annotations

import os
import socket


class DeviceUnavailable(RuntimeError):
    pass


def torch_device(name: str):
    """`cpu`, `cuda` or `auto` (cuda when there is a GPU) as a torch.device; `cuda` where torch sees no GPU
    raises DeviceUnavailable naming the machine and what torch sees there."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise DeviceUnavailable(
            f"extract.device is {name!r} but torch sees no GPU on {socket.gethostname()} (torch {torch.__version__}, "
            f"{build}, CUDA_VISIBLE_DEVICES={visible!r}); set extract.device: auto (or cpu) in the config, or run "
            "extract where there is a GPU (on a cluster: the partition or gres in the profile, docs/slurm.md)"
        )
    return torch.device(name)
