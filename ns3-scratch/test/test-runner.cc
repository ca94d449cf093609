// phantora-ns3-tests: ns-3's test runner over the phantora module's TestSuites (--list, --suite=NAME, --verbose).
#include "ns3/test.h"

int main(int argc, char** argv) { return ns3::TestRunner::Run(argc, argv); }
