"""Local longhaul sites for the examples and tests: deploy/local-sites.sh in a
temporary directory, always stopped on exit.

    with LocalSites(["site-a", "site-b"]) as sites:
        sites.address("site-a")   # "unix:/tmp/.../site-a/control.sock"

If LONGHAUL_SITE_A / LONGHAUL_SITE_B (one variable per site) are already set
(daemons someone else runs), they are used as they are and nothing is started
or stopped; `use_environment=False` always starts sites of its own. Given
sites started by `deploy/local-sites.sh up DIR` (addresses
unix:DIR/SITE/control.sock) keep source_dir() and export_dir() working; for
other daemons they raise, naming what to pass instead.
"""

import os
import shutil
import signal
import subprocess
import tempfile

REPO = os.environ.get(
    "LONGHAUL_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _var(site):
    return "LONGHAUL_SITE_" + site.replace("site-", "").upper().replace("-", "_")


def _local_sites_dir(addresses):
    """DIR when every address is unix:DIR/SITE/control.sock of a site that
    deploy/local-sites.sh set up in DIR (its config is there), else None."""
    dirs = set()
    for site, address in addresses.items():
        path = address[len("unix:"):] if address.startswith("unix:") else ""
        site_dir = os.path.dirname(path)
        if (not path or os.path.basename(path) != "control.sock"
                or os.path.basename(site_dir) != site
                or not os.path.isfile(os.path.join(site_dir, "longhauld.yaml"))):
            return None
        dirs.add(os.path.dirname(site_dir))
    return dirs.pop() if len(dirs) == 1 else None


class LocalSites:
    def __init__(self, sites=("site-a", "site-b"), keep=False, use_environment=True):
        self.sites = list(sites)
        self.keep = keep
        self.use_environment = use_environment
        self.dir = None
        self.addresses = {}
        self.started = False

    def __enter__(self):
        given = {s: os.environ.get(_var(s)) for s in self.sites}
        if self.use_environment and all(given.values()):
            self.addresses = given
            self.dir = _local_sites_dir(given)
            return self
        self.dir = tempfile.mkdtemp(prefix="longhaul-sites-")
        env = dict(os.environ, LONGHAUL_LOCAL_SITES=" ".join(self.sites))
        self._env = env
        self.started = True
        try:
            out = subprocess.run([os.path.join(REPO, "deploy", "local-sites.sh"), "up", self.dir],
                                 env=env, check=True, capture_output=True, text=True).stdout
        except subprocess.CalledProcessError as e:
            self.__exit__(None, None, None)
            raise RuntimeError("local-sites.sh up failed: " + e.stderr) from e
        for line in out.splitlines():
            if line.startswith("export "):
                k, v = line[len("export "):].split("=", 1)
                self.addresses.update({s: v for s in self.sites if _var(s) == k})
        return self

    def address(self, site):
        return self.addresses[site]

    def _require_dir(self, what, instead):
        if self.dir is None:
            raise RuntimeError(
                "%s is not known: %s name daemons that deploy/local-sites.sh did not start; "
                "%s" % (what, " / ".join(_var(s) for s in self.sites), instead))

    def export_dir(self, site):
        self._require_dir("the directory of %s's ckpt export" % site,
                          "pass where it is on this host (e.g. --dest-dir)")
        return os.path.join(self.dir, site, "ckpt")

    def source_dir(self):
        """A directory whose files any of the sites may send: a transfer's
        sources must lie inside one of the site's exports, and each site
        exports the sites' directory as `local` (send-only)."""
        self._require_dir("a directory the sites may send from",
                          "pass one inside an export of the sending site (e.g. --source-dir)")
        d = os.path.join(self.dir, "src")
        os.makedirs(d, exist_ok=True)
        return d

    def kill(self, site):
        """kill -9 the site's daemon (a site dropping out)."""
        with open(os.path.join(self.dir, site, "longhauld.pid")) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)

    def restart(self, site):
        """Starts the site's daemon again after kill(): same config, port and
        state directory (local-sites.sh up starts only the sites not running)."""
        if not self.started:
            raise RuntimeError("these sites were given, not started here")
        try:
            subprocess.run([os.path.join(REPO, "deploy", "local-sites.sh"), "up", self.dir],
                           env=self._env, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            raise RuntimeError("local-sites.sh up failed: " + e.stderr) from e

    def __exit__(self, *exc):
        if not self.started:
            return False
        subprocess.run([os.path.join(REPO, "deploy", "local-sites.sh"), "down", self.dir],
                       env=self._env, check=False, capture_output=True)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False
