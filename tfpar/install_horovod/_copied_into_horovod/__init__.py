"""Files the installer copies whole into Horovod's package as ``horovod/_tfpar_*.py``
(`tfpar.install_horovod.patches.ADDED_MODULES`). tfpar itself never imports them; the tests load
them to check them."""
