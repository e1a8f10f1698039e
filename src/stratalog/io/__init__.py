"""Devices: the only code that touches data files with positioned I/O and syncs."""

from stratalog.io.device import Device, FileDevice, aligned_buffer
from stratalog.io.faulty import FaultPlan, MemDevice

__all__ = ["Device", "FileDevice", "aligned_buffer", "MemDevice", "FaultPlan"]
