"""The plain records every layer speaks."""

from __future__ import annotations

import dataclasses

from mlxcel.items import (
    IMAGE_PLACEHOLDER,
    FunctionCallOutput,
    InputImage,
    InputText,
    Message,
    OutputText,
    Refusal,
    RequestEcho,
    ResponseError,
    ResponseRecord,
    Usage,
    cancelled,
    failed,
    has_images,
    parts_text,
)


def test_echo_defaults_are_not_shared_between_instances() -> None:
    first, second = RequestEcho(model="m"), RequestEcho(model="m")
    assert first.text == second.text == {"format": {"type": "text"}}
    assert first.text is not second.text


def test_images_read_as_a_placeholder_on_their_own_line() -> None:
    image = InputImage(image_url="data:image/png;base64,AAAA")
    assert parts_text([InputText("Look:"), image, InputText("What is it?")]) == (
        f"Look:\n{IMAGE_PLACEHOLDER}\nWhat is it?"
    )
    assert parts_text([image, image]) == f"{IMAGE_PLACEHOLDER}\n{IMAGE_PLACEHOLDER}"
    assert parts_text([OutputText("a"), Refusal("b"), InputText("c")]) == "abc"
    assert Message("user", (InputText("x\n"), image)).text == f"x\n{IMAGE_PLACEHOLDER}"


def test_images_are_found_in_messages_and_call_outputs() -> None:
    image = InputImage(file_id="file_1")
    assert not has_images([Message("user", (InputText("x"),)), FunctionCallOutput("c", "y")])
    assert has_images([Message("user", (image,))])
    assert has_images([FunctionCallOutput("c", IMAGE_PLACEHOLDER, parts=(image,))])


def running() -> ResponseRecord:
    """A response part way through: a message under way, tokens counted."""
    made = Message("assistant", (OutputText("par"),), id="msg_1", status="incomplete")
    asked = (Message("user", (InputText("q"),)),)
    echo = RequestEcho(model="m")
    return ResponseRecord(
        "resp_1", 1, "in_progress", echo, output=(made,), usage=Usage(9, 3), input_items=asked
    )


def test_a_failure_drops_the_output_unless_kept_and_counts_what_it_is_given() -> None:
    record, error = running(), ResponseError("server_error", "boom")
    ended = failed(record, error, usage=Usage(9))
    assert (ended.status, ended.error, ended.output, ended.usage) == (
        "failed",
        error,
        (),
        Usage(9),
    )
    undone = dataclasses.replace(ended, status="in_progress", error=None)
    assert dataclasses.replace(undone, output=record.output, usage=record.usage) == record
    assert failed(record, error, usage=None, output=record.output).output == record.output


def test_a_cancel_keeps_the_output_it_is_given_and_has_no_error() -> None:
    record = running()
    ended = cancelled(record, usage=Usage(), output=record.output)
    assert (ended.status, ended.error, ended.output, ended.usage) == (
        "cancelled",
        None,
        record.output,
        Usage(),
    )
    assert dataclasses.replace(ended, status="in_progress", usage=record.usage) == record
    assert cancelled(record, usage=Usage(9, 3)).output == ()
