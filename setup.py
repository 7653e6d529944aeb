import re

from setuptools import find_packages, setup

# The version is defined once, in tfpar/__init__.py (tfpar.__version__, `tfpar --version`).
with open("tfpar/__init__.py", encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

setup(
    name="tfpar",
    version=VERSION,
    description="Distributed training for Keras (tf_keras and Keras 3): data, parameter-server, Horovod and "
                "pipeline parallelism",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    python_requires=">=3.11,<3.12",  # what CI tests (TensorFlow 2.21 on Python 3.11)
    packages=find_packages(include=["tfpar", "tfpar.*"]),
    package_data={"tfpar": ["py.typed"]},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tf-keras>=2.21,<2.22",
        "numpy",
        "scikit-learn",  # the demo's digits ship with it: no download
        "tensorboard>=2.21,<2.22",  # tf.summary scalars of tfpar.callbacks (TF no longer pulls it in)
        "tensorflow-model-optimization>=0.8.1,<0.9",  # tfpar.quantization: QAT and pruning
    ],
    extras_require={
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.5", "psutil", "hypothesis>=6", "keras-tuner>=1.4", "pyyaml", "ray[train]>=2.50",
                "matplotlib>=3.8"],
        "report": ["matplotlib>=3.8"],  # tfpar report, tfpar demo --report
        "ray": ["ray[train]>=2.50"],  # tfpar.integrations.ray, inside Ray Train's TensorflowTrainer
        # Horovod itself is built by `tfpar install-horovod` (see README). CMake 4 builds it too:
        # the installer sets CMAKE_POLICY_VERSION_MINIMUM for Horovod's bundled Gloo.
        "horovod": ["cmake>=3.13", "cloudpickle", "psutil", "pyyaml", "packaging", "cffi>=1.4.0"],
    },
    entry_points={"console_scripts": ["tfpar=tfpar.cli:main"]},
)
