"""Build hook for the one compiled part, ``heapscope._native`` (everything else is in
pyproject.toml). It is optional: without a C compiler and Python's headers the install still
succeeds and heapscope runs the same loops in Python, only slower (``heapscope env`` says
which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "heapscope._native",
            ["src/heapscope/_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        )
    ],
)
