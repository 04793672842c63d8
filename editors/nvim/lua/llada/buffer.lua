--- What the plugin's per-buffer modules (ghost text, next edit, the attach in init) undo the same way
--- when a buffer is detached: a debounce timer, and the buffer-local mappings they made.
local api = vim.api

local M = {}

--- Stops and closes `state.timer`, if there is one, and forgets it.
---@param state {timer?: uv.uv_timer_t}
function M.close_timer(state)
  if state.timer then
    state.timer:stop()
    state.timer:close()
    state.timer = nil
  end
end

--- Deletes the mappings of {bufnr} in {modes} whose description {mine} says are ours.
---@param bufnr integer
---@param modes string[]
---@param mine fun(desc: string): boolean
function M.del_keymaps(bufnr, modes, mine)
  if not api.nvim_buf_is_valid(bufnr) then
    return
  end
  for _, mode in ipairs(modes) do
    for _, map in ipairs(api.nvim_buf_get_keymap(bufnr, mode)) do
      if map.desc and mine(map.desc) then
        api.nvim_buf_del_keymap(bufnr, mode, map.lhs)
      end
    end
  end
end

return M
