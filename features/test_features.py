"""Binds every scenario in this folder."""

from pytest_bdd import scenarios

scenarios(".")
