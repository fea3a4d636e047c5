// Finding a run's checkpoints (checkpoint.h writes and reads them), without libtorch: the
// launcher and the commands that only look for them include this alone.
#pragma once

#include <filesystem>

namespace starling::train {

// Resolves a run directory, its checkpoints directory, or a checkpoint directory to the
// checkpoint it means (the newest for the first two: the one `latest` names, or where that file
// is lost, the complete checkpoint of the highest step). CheckpointError if there is none.
std::filesystem::path find_checkpoint(const std::filesystem::path& path);

// Whether the run directory `run_dir` holds a checkpoint: checkpoints/latest, or where that file
// is lost, a complete checkpoint directory all the same (a run that started fresh there would
// write over them).
bool holds_checkpoint(const std::filesystem::path& run_dir);

}  // namespace starling::train
