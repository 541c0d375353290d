"""Fake `cuda` tensors on a CPU-only torch that compute for real, so a whole decode loop can run and any op that
mixes devices fails as it would on a GPU.

torch's FakeTensorMode also gives `cuda` tensors on a CPU build, but it has no values: the decode loop reads
values every round (`.tolist()`, `bool(...)`), which fake tensors refuse. Here a wrapper tensor reports
`cuda:0` and holds a real CPU tensor; one dispatch mode runs every op on the CPU values and raises
`DeviceMismatch` where a CUDA build would refuse the op (two devices among its tensor arguments, CPU 0-dim
scalars excepted, as in torch). Factories with `device="cuda"` and `.to("cuda")` make wrapped tensors; a
factory without `device=` makes a plain CPU tensor, which is the bug this catches.

Limit: autograd cannot record `cuda` tensors on a CPU build (its device guard aborts the process), so training
is checked through its forward pass under `torch.no_grad()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
# Accept tensors on two devices on a CUDA build: copies, and indexing with CPU index tensors or values.
IN_PLACE_FROM_ANY_DEVICE = {torch.Tensor.copy_, torch.Tensor.__setitem__}
CROSS_DEVICE_FUNCTIONS = IN_PLACE_FROM_ANY_DEVICE | {torch.Tensor.__getitem__, torch._has_compatible_shallow_copy_type}
DEVICE_PROPERTIES = {"device": CUDA, "is_cuda": True, "is_cpu": False}


# Reads of a tensor's values on the host (a device-to-host copy on a GPU); a CPU build's device guard refuses them.
HOST_READS = {
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.__array__,
}


class DeviceMismatch(RuntimeError):
    """An op was given tensors on two devices; a CUDA build of torch would refuse it."""


class FakeCudaTensor(torch.Tensor):
    """Reports device cuda:0; `.cpu_value` holds the CPU tensor that ops actually run on."""

    cpu_value: torch.Tensor

    @staticmethod
    def __new__(cls, real: torch.Tensor) -> "FakeCudaTensor":
        return torch.Tensor._make_wrapper_subclass(
            cls,
            real.shape,
            strides=real.stride(),
            storage_offset=real.storage_offset(),
            dtype=real.dtype,
            device=CUDA,
            requires_grad=real.requires_grad,
            layout=real.layout,
        )

    def __init__(self, real: torch.Tensor) -> None:
        self.cpu_value = real

    def __repr__(self) -> str:
        return f"FakeCudaTensor({self.cpu_value!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("FakeCudaTensor is used inside fake_cuda() only")


def _device_type(tensor: torch.Tensor) -> str:
    return "cuda" if isinstance(tensor, FakeCudaTensor) else tensor.device.type


def _real(value):
    return value.cpu_value if isinstance(value, FakeCudaTensor) else value


def _wrap(value):
    return FakeCudaTensor(value) if isinstance(value, torch.Tensor) and not isinstance(value, FakeCudaTensor) else value


def _is_cuda(device) -> bool:
    return device is not None and not isinstance(device, torch.Tensor) and torch.device(device).type == "cuda"


def _move(func, tensor: torch.Tensor, args: tuple, kwargs: dict):
    """Tensor.to / .cuda / .cpu: the one place a tensor changes device."""
    if func is torch.Tensor.cuda:
        return tensor if isinstance(tensor, FakeCudaTensor) else FakeCudaTensor(tensor.detach())
    if func is torch.Tensor.cpu:
        return _real(tensor)
    positional = [a for a in args if isinstance(a, (str, torch.device, torch.Tensor))]
    device = kwargs.get("device", positional[0] if positional else None)
    if isinstance(device, torch.Tensor):  # .to(other): its device and dtype
        args, kwargs, device = (
            (device.dtype, *args[1:]),
            kwargs,
            (CUDA if isinstance(device, FakeCudaTensor) else device.device),
        )
    on_cuda = _is_cuda(device) if device is not None else isinstance(tensor, FakeCudaTensor)
    args = tuple("cpu" if isinstance(a, (str, torch.device)) else a for a in args)
    kwargs = {k: ("cpu" if k == "device" else v) for k, v in kwargs.items()}
    real = _real(tensor)
    moved = real.to(*args, **kwargs) if (args or kwargs) else real
    if not on_cuda:
        return moved
    if moved is real:
        return tensor if isinstance(tensor, FakeCudaTensor) else FakeCudaTensor(real.detach())
    return FakeCudaTensor(moved)


class _CudaOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return _move(func, args[0], args[1:], kwargs)
        if getattr(func, "__name__", "") == "__get__" and isinstance(args[0], FakeCudaTensor):
            name = getattr(getattr(func, "__self__", None), "__name__", "")
            if name in DEVICE_PROPERTIES:
                return DEVICE_PROPERTIES[name]
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        devices = {_device_type(t) for t in tensors if not (t.dim() == 0 and _device_type(t) == "cpu")}
        if len(devices) > 1 and func not in CROSS_DEVICE_FUNCTIONS:
            shapes = ", ".join(f"{_device_type(t)}{tuple(t.shape)}" for t in tensors)
            raise DeviceMismatch(f"{getattr(func, '__qualname__', func)} got tensors on {sorted(devices)}: {shapes}")
        on_cuda = _is_cuda(kwargs.get("device")) or ("cuda" in devices and func not in HOST_READS)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func in IN_PLACE_FROM_ANY_DEVICE:
            func(*tree_map(_real, args), **tree_map(_real, kwargs))
            return args[0]
        out = func(*tree_map(_real, args), **tree_map(_real, kwargs))
        return tree_map(_wrap, out) if on_cuda else out


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Inside: `device="cuda"` works on a CPU-only torch, computes on the CPU, and device mixes raise."""
    lazy_init, synchronize = torch.cuda._lazy_init, torch.cuda.synchronize
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.cuda._lazy_init = lambda: None  # a CPU build cannot initialise CUDA; nothing here needs it
    torch.cuda.synchronize = lambda device=None: None  # every op has already run, on the CPU
    # Module.to must hand over the wrapper itself: `param.data = wrapper` would keep a plain Parameter object
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    torch._C._ensureCUDADeviceGuardSet()  # a no-op device guard for `cuda`, as FakeTensorMode installs
    try:
        with _CudaOnCpu():
            yield
    finally:
        torch.cuda._lazy_init, torch.cuda.synchronize = lazy_init, synchronize
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
