"""Saved compiled models: `save` writes one package file, `load` rebuilds the model from it on any machine.

The saved form of the compile stage's output: no code and no pickle inside, only data
(JSON records, safetensors arrays, C sources, TeSA tables) checked against a manifest.
`se.save` / `se.load` and `CompiledModel.save` are the entry points; the parts:

* `archive.py`: the zip file and its manifest (format version, hashes of every part);
* `values.py`, `tensors.py`, `names.py`: plain values, tensors and code names as data;
* `modules.py`, `fx_graph.py`, `codecs.py`: module trees and fx graphs as records;
* `kernels.py`: C sources saved, libraries built again (native, rebuilt, or references);
* `parts.py`, `reading.py`: what every package holds and the first steps of every load;
* `save.py`, `load.py` (compiled models), `inplace_form.py` (models compiled in place).

Example:
    >>> import sparta_explore as se
    >>> se.save(cm, "model.sparta"); cm2 = se.load("model.sparta")   # doctest: +SKIP
"""
