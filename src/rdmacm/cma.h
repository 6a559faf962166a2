// cma.h: the helpers the drop-in librdmacm's sources share: the device
// (device.h) and socket addresses (addr.h). New code includes those two
// directly.
#pragma once

#include "rdmacm/addr.h"
#include "rdmacm/device.h"
