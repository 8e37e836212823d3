"""deploy/local-sites.sh itself: `down` stops every site `up` started under
DIR, including sites that only the `up` call's LONGHAUL_LOCAL_SITES named."""

import os
import subprocess
import time
import unittest

import lh


def wait_gone(pid, timeout=30):
    deadline = time.time() + timeout
    while not lh.process_gone(pid):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


class LocalSitesTest(lh.SitesTestCase):
    site_names = ("site-a", "site-b", "site-c")

    def test_down_without_the_site_list_stops_every_site(self):
        pids = {site: self.sites.pid(site) for site in self.site_names}
        env = dict(os.environ, LONGHAUL_BIN=lh.BIN)
        env.pop("LONGHAUL_LOCAL_SITES", None)
        subprocess.run([lh.LOCAL_SITES, "down", self.sites.dir], env=env, check=True,
                       capture_output=True)
        still_running = [site for site, pid in pids.items() if not wait_gone(pid)]
        self.assertEqual(still_running, [], "local-sites.sh down left these sites running")
        for site in self.site_names:
            self.assertFalse(os.path.exists(self.sites.path(site, "longhauld.pid")), site)


if __name__ == "__main__":
    unittest.main()
