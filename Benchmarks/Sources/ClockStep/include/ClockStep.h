#pragma once
/// The step now in force, in seconds (what TUSA_CLOCK_STEP_FILE said when last read).
int clock_step_seconds(void);
