"""The compiled core, stratalog._native (src/native/): built where a C compiler and Python's headers are,
optional everywhere else. Without it stratalog runs on the Python twins and says so at start-up
(stratalog.native). STRATALOG_BUILD_STRICT=1 (make run / make test) makes warnings errors and a failed
build fatal, so a tested tree never falls back unnoticed. Everything else is in pyproject.toml."""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

STRICT = os.environ.get("STRATALOG_BUILD_STRICT") == "1"
#: Every warning the compiler knows that reads on this code; -Werror in the strict build.
WARNINGS = ["-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wconversion", "-Wno-sign-conversion",
            "-Wstrict-prototypes", "-Wmissing-prototypes"]
SANITIZE = os.environ.get("STRATALOG_SANITIZE") == "1"


class OptionalBuildExt(build_ext):
    """Build the extension; where that fails (no compiler, no headers), warn and go on without it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:   # distutils raises CCompilerError, CompileError, LinkError, OSError...
            if STRICT:
                raise
            print(f"stratalog: the compiled core was not built ({e}); stratalog runs on its Python code",
                  file=sys.stderr)


flags = ["-O2", "-std=c11", *WARNINGS, *(["-Werror"] if STRICT else [])]
link = []
if SANITIZE:
    flags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    link += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[Extension("stratalog._native",
                           sources=["src/native/module.c", "src/native/records.c", "src/native/stored.c",
                                    "src/native/writer.c", "src/native/array_counts.c", "src/native/puts.c",
                                    "src/native/crc.c", "src/native/runs.c", "src/native/produce.c",
                                    "src/native/names.c", "src/native/bulk.c",
                                    "src/native/layout.c", "src/native/merge.c",
                                    "src/native/chunks.c", "src/native/tail.c",
                                    "src/native/wal_record.c"],
                           depends=["src/native/native.h"], extra_compile_args=flags, extra_link_args=link)],
    cmdclass={"build_ext": OptionalBuildExt},
)
