"""weft.runtime: load a .weft artifact and run it on a device. Imports with numpy alone (no onnx), so it
works on a board; devices come from a registry (:mod:`weft.runtime.devices`)."""

from weft.core.artifact import Artifact, ArtifactError, Section, load_artifact
from weft.core.reference import run_reference
from weft.core.walker import FeedError, RunResult
from weft.runtime.cpu_device import CpuDevice, CudaDevice  # registers the "cpu" and "cuda" devices
from weft.runtime.devices import Device, DeviceError, available_devices, create_device, register_device
from weft.runtime.fsim_device import FsimDevice  # registers the "fsim" device
from weft.runtime.pynq_device import PynqDevice  # registers the "pynq" device
from weft.runtime.remote_device import RemoteDevice  # registers the "remote" device ("remote:HOST:PORT")
from weft.runtime.rtl_device import RtlDevice  # registers the "rtl" device
from weft.runtime.session import InferenceSession, NodeArg

__all__ = [
    "Artifact", "ArtifactError", "CpuDevice", "CudaDevice", "Device", "DeviceError", "FeedError", "FsimDevice",
    "InferenceSession", "NodeArg", "PynqDevice", "RemoteDevice", "RtlDevice", "RunResult", "Section",
    "available_devices", "create_device", "load_artifact",
    "register_device", "run_reference",
]
