// Test seams of the exchange client (client/exchange.cc). Private to client/
// and its tests: not part of the public API.
#ifndef LONGHAUL_CLIENT_EXCHANGE_TESTING_H_
#define LONGHAUL_CLIENT_EXCHANGE_TESTING_H_

#include <cstddef>
#include <functional>

namespace longhaul::client_internal {

// Called on the copying thread after each piece of a streamed buffer (a
// Send's or an AllReduce's) is published in its segment's progress word,
// with the bytes published so far and the buffer's length. A test holds the
// copy there to watch what the daemon does with a partly written buffer.
using PiecePublished = std::function<void(size_t published, size_t total)>;

// Sets the hook of every later streamed copy in this process; an empty one
// (the default) is never called. Thread-safe; a copy under way keeps the
// hook it started with.
void SetPiecePublishedForTesting(PiecePublished hook);

}  // namespace longhaul::client_internal

#endif  // LONGHAUL_CLIENT_EXCHANGE_TESTING_H_
