/*
 * version.h - the version of orch itself (one place), printed by
 * `orch --version` / `orch version` next to the engine ABI version it speaks
 * (ORCH_ENGINE_ABI_MAJOR/MINOR from engine_api/orch_engine.h).
 */
#ifndef ORCH_VERSION_H
#define ORCH_VERSION_H

#define ORCH_VERSION "0.2.0"

#endif
