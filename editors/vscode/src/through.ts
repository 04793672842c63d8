/** Typing through a suggestion: what is left of the text last shown once the user has typed the start
 *  of it, so that it stays on screen (trimmed) while the revised answer is computed. Pure. */

/** A suggestion as it was shown: where, and the text of its line then. */
export interface Shown {
    uri: string;
    line: number;
    character: number;
    lineText: string;
    text: string;
}

/** The cursor now, and the text of its line. */
export interface Here {
    uri: string;
    line: number;
    character: number;
    lineText: string;
}

/** The rest of `shown` when the only change since is text typed at its place that it begins with, and
 *  some of it is left; undefined otherwise (moved, edited elsewhere on the line, typed something else,
 *  typed all of it). */
export function restAfterTyping(shown: Shown | undefined, here: Here): string | undefined {
    if (shown === undefined || shown.uri !== here.uri || shown.line !== here.line || here.character <= shown.character) {
        return undefined;
    }
    const typed = here.lineText.slice(shown.character, here.character);
    const expected = shown.lineText.slice(0, shown.character) + typed + shown.lineText.slice(shown.character);
    if (here.lineText !== expected || typed.length >= shown.text.length || !shown.text.startsWith(typed)) {
        return undefined;
    }
    return shown.text.slice(typed.length);
}
