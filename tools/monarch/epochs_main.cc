// monarch-epochs: the same as `monarch epochs`, under its older name.

int RunEpochs(int argc, char** argv);

int main(int argc, char** argv) { return RunEpochs(argc, argv); }
