//===- moec.cpp - the MoE compiler ------------------------------*- C++ -*-===//
#include "moe/Driver/Moec.h"

int main(int argc, char **argv) { return moe::moecMain(argc, argv); }
