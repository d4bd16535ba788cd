// Deliberately wrong: core must not include a layer above it (checked by layering_detects_test).
#pragma once
#include "collectives/communicator.h"
