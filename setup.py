"""The design card's layout: the core in ``envkit/``, the bridges to outside systems in ``adapters/`` (installed as
``envkit.adapters``) and the built-in envs in ``envs/`` (installed as ``envkit.envs``). Everything else about the
distribution is in pyproject.toml; this file only derives the package list from those three folders, so a new
subpackage is installed without editing a list."""

from setuptools import find_namespace_packages, setup

PACKAGE_DIRS = {"envkit": "envkit", "envkit.adapters": "adapters", "envkit.envs": "envs"}

setup(
    package_dir=PACKAGE_DIRS,
    packages=[
        f"{name}.{sub}" if sub else name
        for name, folder in PACKAGE_DIRS.items()
        for sub in ["", *find_namespace_packages(folder, exclude=["*__pycache__*"])]
    ],
)
