"""Build hook for the compiled parts (everything else is in pyproject.toml), both optional:
without a C compiler and Python's headers the install still succeeds.

- ``heapscope._native``: the per-stack loops; without it heapscope runs the same loops in
  Python, only slower (``heapscope env`` says which).
- ``heapscope._preload``: not a Python module but the helper ``heapscope run`` preloads into
  the programs it starts (a control thread on a socket, jemalloc's messages kept); without it
  heapscope reaches them through gdb, as any other process.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "heapscope._native",
            ["src/heapscope/_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "heapscope._preload",
            ["src/heapscope/_preload.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"],
            extra_link_args=["-pthread", "-ldl"],
            optional=True,
        ),
    ],
)
