// Whether the run was asked to stop (its first SIGINT or SIGTERM, trainer.cpp): the trainer stops
// at the step's end (a swarm's: its round's); a step that could last long (an atom step gathering
// a large strategy.target_batch) ends early on it.
#pragma once

namespace starling::train {

bool stop_requested();

}  // namespace starling::train
