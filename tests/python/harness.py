"""Shared by the Python tests: local sites and joining a group at every site."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ.get(
    "LONGHAUL_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))), "examples"))

from local_sites import LocalSites  # noqa: E402,F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
from lh import in_parallel, raise_any  # noqa: E402,F401

import longhaul  # noqa: E402


def join_all(sites, name, members):
    return raise_any(in_parallel([
        (lambda s=s: longhaul.ExchangeGroup(sites.address(s), name, members, timeout=30.0))
        for s in members]))


class GroupTestCase(unittest.TestCase):
    """Local daemons for SITES, started once per class; each test joins a
    group of its own name at every site (self.groups, in SITES order) and
    closes it afterwards."""

    SITES = ["site-a", "site-b"]

    @classmethod
    def setUpClass(cls):
        cls.sites = LocalSites(cls.SITES)
        cls.sites.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.sites.__exit__(None, None, None)

    def setUp(self):
        self.groups = join_all(self.sites, self.id(), self.SITES)

    def tearDown(self):
        for g in self.groups:
            g.close()
