#pragma once
// The one sanitizer for text that came from a guest (or anyone else we do
// not trust) on its way to a terminal, a log line or a page. The customer
// has root in its VM, so a hostname or a step message may hold an escape
// sequence that clears the admin's screen, rewrites what an earlier line
// said, or reorders a line with a bidi override (Trojan Source). Such text
// is shown escaped, never interpreted:
//
//   C0 controls and DEL       \n \r \t, else \xHH (ESC [ 2 J shows as the 7 characters \x1b[2J)
//   C1 controls U+0080-009F   \u0085
//   bidi controls             \u202e (U+202A-202E, U+2066-2069, U+200E, U+200F, U+061C)
//   line/paragraph separators \u2028 \u2029
//   invalid UTF-8             \xHH per byte that is not part of a valid sequence
//
// Everything else, printable ASCII and valid UTF-8 text in any script,
// passes unchanged, so an ordinary string costs a scan and no copy in
// is_display_safe(). JSON and YAML output do not use this: their encoders
// keep values exact and escape what their syntax needs.
//
// Pure functions over bytes: no allocation beyond the result, no locale,
// safe for any input (a fuzz target may call them directly).
#include <cstddef>
#include <string>
#include <string_view>

namespace factory::display {

// The text with every character a terminal could act on shown escaped.
std::string sanitize(std::string_view text);

// True when sanitize(text) == text.
bool is_display_safe(std::string_view text);

// How many terminal columns the (already sanitized) text takes, counting one
// per code point: what a table needs to align its columns.
std::size_t columns(std::string_view sanitized);

}  // namespace factory::display
