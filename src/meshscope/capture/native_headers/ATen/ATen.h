// What c10d's Work.hpp uses of <ATen/ATen.h> (torch 2.13): at::Tensor and c10::ivalue::Future.
// native_build puts this folder before torch's headers when it compiles native_recorder.cpp, which
// includes Work.hpp for its getFuture: the whole <ATen/ATen.h> (every ATen operator) costs about
// 4 s more of a first trace's CPU. A torch whose Work.hpp needs more fails this build, and
// native_build compiles again with torch's own header.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
