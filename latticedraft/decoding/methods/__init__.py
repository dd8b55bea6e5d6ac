"""One module per decoding method (``--method``), each defining its registry entry ``METHOD``:
its options object, their checks, its label and settings, and its run. A method module imports
no torch at import time: its decoder's modules (the loop, proposers, ``ppd/``, ``dynamo/``)
load when it runs. ``registry.MODULES`` names them."""
