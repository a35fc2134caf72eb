// SipHash-2-4 (Aumasson & Bernstein): a keyed 64-bit MAC, used only for the
// rail handshake's challenge-response.
#pragma once

#include <cstddef>
#include <cstdint>

namespace r2cc {
uint64_t siphash24(const uint8_t key[16], const void* data, size_t len);
}
