// ForPeer: the messages a peer reads name exports, never this host's paths.
#include "daemon/peer/peer_errors.h"

#include <vector>

#include "gtest/gtest.h"

namespace longhaul::peer {
namespace {

const std::vector<ExportRoot> kRoots = {
    {"ckpt", "/srv/ckpt", "/mnt/disk1/ckpt"},
    {"ckpt-old", "/srv/ckpt-old", ""},
};

TEST(ForPeerTest, PathsUnderAnExportBecomeExportNames) {
  EXPECT_EQ(ForPeer("cannot open /mnt/disk1/ckpt/run1/shard-0: No such file or directory", kRoots),
            "cannot open ckpt:run1/shard-0: No such file or directory");
  EXPECT_EQ(ForPeer("destination \"x\" refused: /srv/ckpt/run1/link is a symlink", kRoots),
            "destination \"x\" refused: ckpt:run1/link is a symlink");
  EXPECT_EQ(ForPeer("export ckpt (/srv/ckpt) is not usable", kRoots),
            "export ckpt (ckpt:) is not usable");
  // The longest root wins, and a root is matched as a whole component.
  EXPECT_EQ(ForPeer("cannot write /srv/ckpt-old/a", kRoots), "cannot write ckpt-old:a");
}

TEST(ForPeerTest, OtherHostPathsAreNotNamed) {
  EXPECT_EQ(ForPeer("symlink to /etc/shadow leaves the export", kRoots),
            "symlink to (a path of this site) leaves the export");
  EXPECT_EQ(ForPeer("IO error: /var/lib/longhaul/journal/000012.log: No space left", kRoots),
            "IO error: (a path of this site): No space left");
  EXPECT_EQ(ForPeer("/srv/ckptx/a", kRoots), "(a path of this site)");
}

TEST(ForPeerTest, RelativePathsAndRatesAreLeftAlone) {
  for (const char* message : {"path run1/../x has a \"..\" component", "rate 1 GiB/s",
                              "ckpt:run1/step-3 was published by another site", ""}) {
    EXPECT_EQ(ForPeer(message, kRoots), message);
  }
}

}  // namespace
}  // namespace longhaul::peer
