// status_counters.h: the counters part of `softverbs status`, and `softverbs
// status --json` (docs/LAB.md, "Counters": the schema).
#pragma once

#include <cstdint>
#include <string>

#include "common/counters_query.h"

namespace sv::tools {

// The counters the daemon on `sock` shows this caller (its own user's QPs;
// root: every user's): 0, or the errno of the exchange.
int fetch_counters(int sock, uint32_t& seq, counters::Snapshot& out);

// For `softverbs status`: the port's counters that are not 0, then one line
// per QP with its counters that are not 0.
void print_counters(const counters::Snapshot& s);

// The JSON document of `softverbs status --json`. `daemon` holds the
// daemon's members already written as JSON ("\"pid\": 1, ..."), or is empty.
std::string counters_json(const counters::Snapshot& s, const std::string& daemon);

}  // namespace sv::tools
