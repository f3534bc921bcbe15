"""qkv: attention and Transformers in C++, from Python.

    import qkv
    model = qkv.load("out/demo/model")          # a qkv model folder or a Hugging Face one
    print(model.translate(["我是中国人"]))        # ['私は中国人です']

The compiled part (qkv._qkv) does the work with the GIL released; this file
adds what is easier said in Python. docs/python.md is the whole API.
"""
import os as _os

from . import _qkv
from ._qkv import (
    Embedder,
    Error,
    GenerateStream,
    ImageClassifier,
    LanguageModel,
    Model,
    Tensor,
    Translator,
    runtime,
)

__all__ = [
    "Embedder", "Error", "GenerateStream", "ImageClassifier", "LanguageModel", "Model", "Tensor", "Translator",
    "from_dlpack", "load", "runtime", "train",
]
__version__ = "0.1.0"


def load(path, *, dtype=None, threads=0):
    """The model in the folder `path`: a Translator, LanguageModel, ImageClassifier or Embedder, by its family.

    dtype None keeps the Linear weights as the folder stores them; "f32", "bf16", "f16" or "int8" (blockwise int8)
    loads every one in that dtype (a bfloat16 checkpoint without a float32 copy). threads 0 uses every core.
    """
    return _qkv.load(_os.fspath(path), dtype=dtype or "", threads=threads)


def from_dlpack(array):
    """A qkv.Tensor sharing the memory of `array`: a NumPy array, a torch tensor, or anything
    with __dlpack__ or the buffer protocol. Nothing is copied; the array stays alive as long
    as the tensor does. A read-only NumPy array is copied first (qkv tensors are writable)."""
    flags = getattr(array, "flags", None)
    if flags is not None and not flags.writeable:
        import numpy
        array = numpy.array(array)
    return Tensor.from_dlpack(array)


def train(config=None, *, train, out, valid=None, steps=None, epochs=None, lr=None, seed=None, precision=None,
          init=None, resume=False, threads=0, on_step=None, on_eval=None, verbose=True):
    """Trains as `qkv train` does and returns {"out", "last_step", "stopped_early"}.

    config: a config file (configs/*.json); train/valid: a TSV of pairs (translation), a text
    file (decoder) or an IDX folder (vit); without valid, the last 5% of train is held out
    (a vit tests on train's t10k files). steps/epochs/lr/seed override the config's, and so
    does precision ("f32", or "bf16" for mixed precision: docs/low-precision.md). init: a model
    folder (qkv or Hugging Face) to fine-tune; config is then optional and may hold only a "train" section.
    on_step(dict) runs after every step; on_eval(dict) after each validation (each epoch for a
    vit), and a true return from it ends a translation run there. verbose prints a line per validation.
    """
    if verbose:
        user_eval = on_eval

        def on_eval(report):
            print(_eval_line(report), flush=True)
            return user_eval(report) if user_eval is not None else False

    return _qkv.train(
        "" if config is None else _os.fspath(config), train=_os.fspath(train), out=_os.fspath(out),
        valid="" if valid is None else _os.fspath(valid), steps=steps, epochs=epochs, lr=lr, seed=seed,
        precision=precision, init="" if init is None else _os.fspath(init), resume=resume, threads=threads, on_step=on_step, on_eval=on_eval)


def _eval_line(r):
    best = "  (best, saved)" if r.get("best") else ""
    if "epoch" in r:
        return f"epoch {r['epoch']}: train loss {r['train_loss']:.4f}  test accuracy {r['test_accuracy']:.4f}{best}"
    if "chrf" in r:
        return f"step {r['step']}: valid loss {r['valid_loss']:.4f}  chrF {r['chrf']:.2f}  BLEU {r['bleu']:.2f}{best}"
    return f"step {r['step']}: valid loss {r['valid_loss']:.4f}  perplexity {r['perplexity']:.3f}{best}"
