"""Registers and spill frame of the group-rational kernels on sm_90, without a GPU.

    python scripts/rational_registers.py [bfloat16|float16|float32] [pass.table=value ...]

e.g. ``python scripts/rational_registers.py bfloat16 backward.items_per_step=3 backward.blocks_per_sm=2``
(tables of ``warpkan.kernels.rational``: items_per_step, blocks_per_sm, waves). Warp's NVRTC compiles the
module ahead of time for sm_90 (``wp.compile_aot_module``: no driver needed); the cubin's global ``.nv.info``
section holds each kernel's register count (EIATTR_REGCOUNT) and stack frame (EIATTR_FRAME_SIZE: bytes of
local memory a lane, i.e. spills when nonzero). The launch shapes in ``warpkan.kernels.rational`` were kept
spill-free with it.
"""

import os
import struct
import sys
import tempfile

import warp as wp

from warpkan._warp_output import start_warp  # noqa: E402

start_warp()

from warpkan.kernels import rational as kr  # noqa: E402

EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL, EIFMT_HVAL, EIFMT_BVAL = 0x04, 0x03, 0x02


def elf_sections(data: bytes) -> dict:
    """name -> (file offset, size) of a 64-bit little-endian ELF's sections."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    sections = {}
    for name, _type, _flags, _addr, offset, size, *_ in headers:
        end = data.index(b"\0", names_at + name)
        sections[data[names_at + name:end].decode()] = (offset, size)
    return sections


def nv_info_attributes(blob: bytes):
    """(attribute, payload) of an .nv.info section: a format byte, an attribute byte, then the payload."""
    i = 0
    while i < len(blob):
        fmt, attr = blob[i], blob[i + 1]
        if fmt == EIFMT_SVAL:
            size, = struct.unpack_from("<H", blob, i + 2)
            yield attr, blob[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt in (EIFMT_HVAL, EIFMT_BVAL):
            yield attr, None
            i += 4
        else:
            yield attr, None
            i += 2


def kernel_resources(cubin: str) -> dict:
    """kernel symbol -> {"regs": n, "frame": bytes}."""
    data = open(cubin, "rb").read()
    sections = elf_sections(data)
    symtab_at, symtab_size = sections[".symtab"]
    strtab_at, _ = sections[".strtab"]
    names = {}
    for i in range(symtab_size // 24):
        name, = struct.unpack_from("<I", data, symtab_at + i * 24)
        end = data.index(b"\0", strtab_at + name)
        names[i] = data[strtab_at + name:end].decode()
    info_at, info_size = sections[".nv.info"]
    found: dict = {}
    for attr, payload in nv_info_attributes(data[info_at:info_at + info_size]):
        if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and payload is not None:
            symbol, value = struct.unpack_from("<II", payload)
            key = "regs" if attr == EIATTR_REGCOUNT else "frame"
            found.setdefault(names.get(symbol, str(symbol)), {})[key] = value
    return {name: vals for name, vals in found.items() if "cuda_kernel" in name}


def main():
    io_name = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    vec = kr.IO_TYPES[io_name][2]
    for spec in sys.argv[2:]:
        key, value = spec.split("=")
        pass_name, table = key.split(".")
        getattr(kr, table.upper())[pass_name][vec] = int(value)
    kernels = kr.get_kernels(5, 4, "A", io_name, vec)
    with tempfile.TemporaryDirectory() as out:
        paths = wp.compile_aot_module(kernels.module, device=None, arch=90, module_dir=out, use_ptx=False)
        print(kernels.module)
        for name, vals in kernel_resources(str(paths[0])).items():
            short = name.rsplit("__locals__", 1)[-1].split("_")[0]
            print(f"  {short:10s} registers {vals.get('regs')}  frame {vals.get('frame', 0)} bytes")


if __name__ == "__main__":
    main()
