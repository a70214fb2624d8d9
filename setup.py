"""The design card's layout: the core in ``envkit/``, the bridges to outside systems in ``adapters/`` (installed as
``envkit.adapters``) and the built-in envs in ``envs/`` (installed as ``envkit.envs``). Everything else about the
distribution is in pyproject.toml; this file only derives the package list from those three folders, so a new
subpackage is installed without editing a list.

An editable install (``pip install -e .``) puts the clone's root on ``sys.path`` (setuptools' ``compat`` editable
mode) instead of setuptools' default import hook, which answers only after Python's own path search: with the hook, a
Python started in the folder that holds a clone named ``envkit`` found that folder first, as an empty namespace
package, and ``import envkit`` gave a module without ``Env`` (pypa/setuptools#3557). On the path, the clone's
``envkit/__init__.py`` is a regular package and wins; it adds the clone's ``adapters/`` and ``envs/`` as
``envkit.adapters`` and ``envkit.envs`` itself. ``--config-settings editable_mode=strict`` (or ``lenient``) still
chooses another mode; ``tests/test_packaging.py`` holds the four ways in.
"""

from setuptools import find_namespace_packages, setup
from setuptools.command.editable_wheel import editable_wheel

PACKAGE_DIRS = {"envkit": "envkit", "envkit.adapters": "adapters", "envkit.envs": "envs"}


class EditableOnPath(editable_wheel):
    """``editable_wheel`` whose default mode is ``compat``: the clone's root as a plain ``sys.path`` entry."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.mode = "compat"


setup(
    cmdclass={"editable_wheel": EditableOnPath},
    package_dir=PACKAGE_DIRS,
    packages=[
        f"{name}.{sub}" if sub else name
        for name, folder in PACKAGE_DIRS.items()
        for sub in ["", *find_namespace_packages(folder, exclude=["*__pycache__*"])]
    ],
)
