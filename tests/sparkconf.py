"""The Spark settings of the tests' own JVMs (the session's, the kill tests' drivers)."""

#: The JIT's first tier only, one compiler thread, and the serial collector. A test's JVM lives a few
#: minutes and runs small jobs, where C2's and the parallel collector's threads cost more CPU than they
#: give back: a local session's start plus a small aggregation and a JSON read took 15.6 s of JVM CPU
#: instead of 31 (and 18-19 s of wall instead of 23) on a 2-vCPU machine. Not for `stratalog pipeline` or
#: `bench spark`, whose jobs are long enough for C2 to pay.
TEST_JVM_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"}
