--- Partial accept: how much of a suggestion the next word, or the next line, is. Pure string
--- functions on the suggestion's text; knows nothing of buffers, windows or requests.
local M = {}

-- Identifier bytes: letters, digits, `_`, and every byte of a multibyte UTF-8 character, so a word is
-- never cut inside a character (and `naïve` or `名前` stay one word).
local WORD = '[%w_\128-\255]'
local PUNCT = '[^%w_\128-\255%s]'

--- Length in bytes of the next word of {text}: the whitespace before it (line breaks and the next
--- line's indent included, so a keystroke never accepts only blanks), then either an identifier or a
--- run of punctuation (`split(';')` is `split`, then `(';')`). All of {text} when only blanks remain.
---@param text string
---@return integer
function M.word(text)
  local blanks = #text:match('^%s*')
  local token = text:match('^' .. WORD .. '+', blanks + 1) or text:match('^' .. PUNCT .. '+', blanks + 1) or ''
  return blanks + #token
end

--- Length in bytes of the next line of {text}: up to its first line break, which stays in the rest.
--- When {text} starts with a line break (its first line was accepted already), that break and the line
--- after it, so each keystroke adds one line.
---@param text string
---@return integer
function M.line(text)
  local from = text:sub(1, 1) == '\n' and 2 or 1
  local newline = text:find('\n', from, true)
  return newline and newline - 1 or #text
end

return M
