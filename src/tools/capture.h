// capture.h: `softverbs capture`, the device's traffic as pcapng
// (docs/LAB.md, "Capture"; the ring: common/capture_ring.h).
#pragma once

namespace sv::tools {

int capture_main(int argc, char** argv);

}  // namespace sv::tools
