#include "common/fault_plan.h"

#include <gtest/gtest.h>

namespace sv::faults {
namespace {

TEST(FaultPlan, ParsesEverySectionAndSelector) {
  Plan p;
  ASSERT_EQ("", parse("seed=7; wire:drop=0.01,dup=0.02,reorder=0.03,delay_us=250,corrupt=0.001;"
                      "wire@qp=0x12:drop=0.5;wc@qp=18:op=5,status=RNR_RETRY_EXC_ERR;wc:rate=0.25,status=IBV_WC_REM_OP_ERR",
                      p));
  EXPECT_EQ(7u, p.seed);
  ASSERT_EQ(2u, p.wire.size());
  EXPECT_TRUE(p.wire[0].all);
  EXPECT_DOUBLE_EQ(0.01, p.wire[0].drop);
  EXPECT_DOUBLE_EQ(0.02, p.wire[0].dup);
  EXPECT_DOUBLE_EQ(0.03, p.wire[0].reorder);
  EXPECT_DOUBLE_EQ(0.001, p.wire[0].corrupt);
  EXPECT_EQ(250u, p.wire[0].delay_us);
  EXPECT_FALSE(p.wire[1].all);
  EXPECT_EQ(0x12u, p.wire[1].qpn);
  EXPECT_EQ(&p.wire[1], wire_for(p, 0x12));
  EXPECT_EQ(&p.wire[0], wire_for(p, 0x13));
  ASSERT_EQ(2u, p.wc.size());
  EXPECT_FALSE(p.wc[0].all);
  EXPECT_EQ(18u, p.wc[0].qpn);
  EXPECT_EQ(5u, p.wc[0].op);
  EXPECT_EQ(IBV_WC_RNR_RETRY_EXC_ERR, p.wc[0].status);
  EXPECT_TRUE(p.wc[1].all);
  EXPECT_DOUBLE_EQ(0.25, p.wc[1].rate);
  EXPECT_EQ(IBV_WC_REM_OP_ERR, p.wc[1].status);
}

TEST(FaultPlan, AcceptsTheBareWireFormWithItsSeed) {
  Plan p;
  ASSERT_EQ("", parse("drop=0.01,reorder=0.01,seed=3", p));
  EXPECT_EQ(3u, p.seed);
  ASSERT_EQ(1u, p.wire.size());
  EXPECT_DOUBLE_EQ(0.01, p.wire[0].drop);
  EXPECT_EQ(200u, p.wire[0].delay_us);
  ASSERT_EQ("", parse("", p));
  EXPECT_TRUE(p.empty());
}

TEST(FaultPlan, RefusesEveryMalformedPlanWithAReason) {
  const char* bad[] = {
      "drop=2",                        // out of range
      "drop=0.1x",                     // trailing characters
      "drop=-0.1",                     // negative
      "wire:drop=0.1,drop=0.2",        // duplicate
      "wire:lose=0.1",                 // unknown key
      "wire:seed=3",                   // seed is a clause of its own
      "wc:op=3",                       // no status
      "wc:status=REM_OP_ERR",          // neither op nor rate
      "wc:op=3,rate=0.1,status=REM_OP_ERR",
      "wc:op=0,status=REM_OP_ERR",     // ops count from 1
      "wc:op=3,status=WR_FLUSH_ERR",   // not a status a plan injects
      "wc@qp=0:op=1,status=REM_OP_ERR",
      "wc@qp=zz:op=1,status=REM_OP_ERR",
      "wc@0x12:op=1,status=REM_OP_ERR",
      "disk:drop=0.1",                 // unknown section
      "wire:drop",                     // not key=value
      "wire:drop=0.1,,dup=0.1",
      "seed=-1",
      "wire:delay_us=0",
      "wc:op=3,after_ms=10,status=REM_OP_ERR",  // op excludes time
      "wc:after_ms=0,status=REM_OP_ERR",         // times count from 1 ms
      "wc:after_ms=3600001,status=REM_OP_ERR",
  };
  for (const char* s : bad) {
    Plan p;
    p.seed = 99;
    std::string e = parse(s, p);
    EXPECT_NE("", e) << s;
    EXPECT_EQ(99u, p.seed) << s << ": a refused plan leaves the output alone";
  }
  Plan p;
  EXPECT_NE(std::string::npos, parse("seed=1;wire:lose=1", p).find("clause 2"));
}

TEST(FaultPlan, WcRulesByTime) {
  Plan p;
  ASSERT_EQ("", parse("wc:after_ms=500,status=RETRY_EXC_ERR;wc@qp=7:rate=0.5,after_ms=20,delay_us=100", p));
  ASSERT_EQ(2u, p.wc.size());
  EXPECT_EQ(500u, p.wc[0].after_ms);
  EXPECT_EQ(0u, p.wc[0].op);
  EXPECT_EQ(0.0, p.wc[0].rate);
  EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, p.wc[0].status);
  EXPECT_EQ(20u, p.wc[1].after_ms);
  EXPECT_EQ(0.5, p.wc[1].rate);
  EXPECT_EQ(100u, p.wc[1].delay_us);
  Plan q;
  EXPECT_NE(std::string::npos, parse("wc:op=1,after_ms=5,status=REM_OP_ERR", q).find("op= takes neither"));
}

TEST(FaultPlan, FileTextDropsCommentsAndJoinsLines) {
  Plan p;
  std::string t = file_text("# a plan\nseed=9\n\nwc@qp=5:op=2,status=LOC_PROT_ERR  # the second op\n");
  EXPECT_EQ("seed=9;wc@qp=5:op=2,status=LOC_PROT_ERR", t);
  ASSERT_EQ("", parse(t, p));
  EXPECT_EQ(9u, p.seed);
  EXPECT_STREQ("LOC_PROT_ERR", status_name(p.wc[0].status));
}

TEST(FaultPlan, ParsesTheAsyncEventSections) {
  Plan p;
  ASSERT_EQ("", parse("port:after_ms=200,down_ms=300; port:op=7,down_ms=50; qp_fatal@qp=0x11:op=2;"
                      "qp_fatal:op=4; cq_err:after_ms=10; cq_err:cq=2,after_ms=20; srq_limit:srq=3,after_ms=5;"
                      "device_fatal:after_ms=0",
                      p));
  ASSERT_EQ(2u, p.port.size());
  EXPECT_EQ(200u, p.port[0].after_ms);
  EXPECT_EQ(0u, p.port[0].op);
  EXPECT_EQ(300u, p.port[0].down_ms);
  EXPECT_EQ(7u, p.port[1].op);
  EXPECT_EQ(50u, p.port[1].down_ms);
  ASSERT_EQ(2u, p.qp_fatal.size());
  EXPECT_FALSE(p.qp_fatal[0].all);
  EXPECT_EQ(0x11u, p.qp_fatal[0].qpn);
  EXPECT_EQ(2u, p.qp_fatal[0].op);
  EXPECT_TRUE(p.qp_fatal[1].all);
  EXPECT_EQ(4u, p.qp_fatal[1].op);
  ASSERT_EQ(4u, p.timed.size());
  EXPECT_EQ(Timed::kCqErr, p.timed[0].kind);
  EXPECT_EQ(1u, p.timed[0].n);
  EXPECT_EQ(10u, p.timed[0].after_ms);
  EXPECT_EQ(2u, p.timed[1].n);
  EXPECT_EQ(Timed::kSrqLimit, p.timed[2].kind);
  EXPECT_EQ(3u, p.timed[2].n);
  EXPECT_EQ(Timed::kDeviceFatal, p.timed[3].kind);
  EXPECT_EQ(0u, p.timed[3].after_ms);
  EXPECT_TRUE(p.raises_events());
  EXPECT_TRUE(p.plans_sends());
  EXPECT_FALSE(p.empty());
  Plan t;
  ASSERT_EQ("", parse("cq_err:after_ms=1", t));
  EXPECT_TRUE(t.raises_events());
  EXPECT_FALSE(t.plans_sends());  // a timed event alone leaves the send path alone
}

TEST(FaultPlan, RefusesEveryMalformedEventClauseWithAReason) {
  const std::pair<const char*, const char*> bad[] = {
      {"port:after_ms=10", "needs down_ms="},
      {"port:down_ms=10", "one of after_ms= or op="},
      {"port:after_ms=10,op=3,down_ms=10", "one of after_ms= or op="},
      {"port:after_ms=10,down_ms=0", "bad value '0' for down_ms"},
      {"port:after_ms=10,down_ms=3600001", "bad value"},
      {"port:after_ms=x,down_ms=5", "bad value 'x' for after_ms"},
      {"port:op=0,down_ms=5", "bad value '0' for op"},
      {"port:after_ms=1,down_ms=5,down_ms=6", "given twice"},
      {"port:after_ms=1,down_ms=5,status=REM_OP_ERR", "unknown setting 'status' for port"},
      {"port@qp=5:after_ms=1,down_ms=5", "takes no QP selector"},
      {"qp_fatal:after_ms=3", "unknown setting 'after_ms' for qp_fatal"},
      {"qp_fatal@qp=0:op=3", "bad QP selector"},
      {"qp_fatal:", "an empty setting"},
      {"cq_err:cq=1", "needs after_ms="},
      {"cq_err:cq=0,after_ms=1", "bad value '0' for cq"},
      {"cq_err:srq=1,after_ms=1", "unknown setting 'srq' for cq_err"},
      {"srq_limit:srq=-1,after_ms=1", "bad value '-1' for srq"},
      {"device_fatal:op=3", "unknown setting 'op' for device_fatal"},
      {"device_fatal", "not key=value"},
      {"link_down:after_ms=1", "unknown section 'link_down'"},
  };
  for (const auto& [text, why] : bad) {
    Plan p;
    p.seed = 99;
    std::string e = parse(text, p);
    EXPECT_NE(std::string::npos, e.find(why)) << text << ": " << e;
    EXPECT_EQ(99u, p.seed) << text << ": a refused plan leaves the output alone";
  }
}

// A request delayed (a wc clause with delay_us instead of a status) and
// one refused with RNR NAKs (rnr), with their selectors.
TEST(FaultPlan, ParsesDelayAndRnrRules) {
  Plan p;
  ASSERT_EQ("", parse("wc@qp=0x10002:op=2,delay_us=150000; wc:rate=0.5,delay_us=10; rnr:op=3,times=4; rnr@qp=7:op=1", p));
  ASSERT_EQ(2u, p.wc.size());
  EXPECT_FALSE(p.wc[0].all);
  EXPECT_EQ(0x10002u, p.wc[0].qpn);
  EXPECT_EQ(2u, p.wc[0].op);
  EXPECT_EQ(150000u, p.wc[0].delay_us);
  EXPECT_EQ(IBV_WC_SUCCESS, p.wc[0].status);
  EXPECT_TRUE(p.wc[1].all);
  EXPECT_EQ(0.5, p.wc[1].rate);
  EXPECT_EQ(10u, p.wc[1].delay_us);
  ASSERT_EQ(2u, p.rnr.size());
  EXPECT_TRUE(p.rnr[0].all);
  EXPECT_EQ(3u, p.rnr[0].op);
  EXPECT_EQ(4u, p.rnr[0].times);
  EXPECT_FALSE(p.rnr[1].all);
  EXPECT_EQ(7u, p.rnr[1].qpn);
  EXPECT_EQ(1u, p.rnr[1].times);  // the default
  EXPECT_TRUE(p.plans_sends());
  EXPECT_FALSE(p.empty());
  Plan only_rnr;
  ASSERT_EQ("", parse("rnr:op=1", only_rnr));
  EXPECT_TRUE(only_rnr.plans_sends());
  EXPECT_FALSE(only_rnr.raises_events());
}

TEST(FaultPlan, RefusesMalformedDelayAndRnrClausesWithAReason) {
  const std::pair<const char*, const char*> bad[] = {
      {"wc:op=2,delay_us=0", "bad value '0' for delay_us"},
      {"wc:op=2,delay_us=10000001", "bad value '10000001' for delay_us"},
      {"wc:op=2,delay_us=5ms", "bad value '5ms' for delay_us"},
      {"wc:op=2,delay_us=10,status=REM_OP_ERR", "one of status= or delay_us="},
      {"wc:op=2", "one of status= or delay_us="},
      {"wc:delay_us=10", "one of op=, rate= or after_ms="},
      {"wc:op=2,delay_us=1,delay_us=2", "given twice"},
      {"rnr:times=3", "needs op="},
      {"rnr:op=0", "bad value '0' for op"},
      {"rnr:op=1,times=0", "bad value '0' for times"},
      {"rnr:op=1,times=1000001", "bad value '1000001' for times"},
      {"rnr:op=1,times=2x", "bad value '2x' for times"},
      {"rnr:op=1,status=RNR_RETRY_EXC_ERR", "unknown setting 'status' for rnr"},
      {"rnr:op=1,op=2", "given twice"},
      {"rnr@qp=0:op=1", "bad QP selector"},
      {"port:after_ms=1,down_ms=5,times=2", "unknown setting 'times' for port"},
  };
  for (const auto& [text, why] : bad) {
    Plan p;
    p.seed = 99;
    std::string e = parse(text, p);
    EXPECT_NE(std::string::npos, e.find(why)) << text << ": " << e;
    EXPECT_EQ(99u, p.seed) << text << ": a refused plan leaves the output alone";
  }
}

}  // namespace
}  // namespace sv::faults
