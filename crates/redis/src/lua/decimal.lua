-- Integers as the decimal strings Redis reads, for the lean scripts' writes (a TAT and its
-- PX expiry, a lease's ZADD score and its PEXPIRE milliseconds), each made once per value
-- in a call: most writes of a call share a few values (`now` plus a cost or a lease time),
-- and Redis would turn every number argument into text with libc's "%.17g" floating-point
-- formatting (exact for integers, but a few percent of a step: benches/lua_instructions.sh).
-- Placed before a lean script's body.
local decimal
do
  local strings, format = {}, string.format
  decimal = function(x)
    local s = strings[x]
    if not s then
      s = format('%d', x)
      strings[x] = s
    end
    return s
  end
end
