#pragma once
#include <speex/speex.h>
