// The dhp executable: everything lives in the libraries; this only hands over the arguments.
#include "trainer/cli.h"

int main(int argc, char** argv) { return dhp::run_cli(argc, argv); }
