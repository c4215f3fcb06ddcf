"""The loaders' one error class (models.errors.FileFormatError)."""

import doctest

import pytest

import models
import models.errors


def test_module_doctest():
    assert doctest.testmod(models.errors).failed == 0


def test_message_names_file_field_and_value():
    err = models.FileFormatError("d/config.json", "vocab_size", "must be positive", -3)
    assert isinstance(err, ValueError)
    assert str(err) == "d/config.json: vocab_size: must be positive, got -3"
    assert (err.path, err.field, err.value) == ("d/config.json", "vocab_size", -3)
    with pytest.raises(models.FileFormatError, match=r"^d/x: no field$"):
        raise models.FileFormatError("d/x", None, "no field")
    long = models.FileFormatError("f", "k", "too long", "x" * 500)
    assert len(str(long)) < 160 and str(long).endswith("...")
